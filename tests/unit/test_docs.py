"""The documentation: README.md is the front door and docs/index.md its copy for the site; the
site builds with `mkdocs build --strict` (a dead link, a page left out of the navigation or a
broken anchor fails it); every relative link of README.md reaches a file."""

import re
import subprocess
import sys

import pytest
from conftest import REPO


def site_index(readme: str) -> str:
    """README.md with its links made relative to docs/ (what docs/index.md holds)."""
    return readme.replace("](docs/", "](")


def test_the_site_home_is_the_readme():
    readme = (REPO / "README.md").read_text()
    assert (REPO / "docs" / "index.md").read_text() == site_index(readme)


def test_every_relative_link_of_the_readme_reaches_a_file():
    readme = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)\)", readme)
    local = [t for t in targets if not t.startswith(("http://", "https://"))]
    assert local and all((REPO / t).exists() for t in local), [
        t for t in local if not (REPO / t).exists()
    ]


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "index.html").is_file() and (
        tmp_path / "ARCHITECTURE" / "index.html"
    ).is_file()
