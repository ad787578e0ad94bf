"""The shape of the code, held by the test command: the import contract (pyproject.toml's
[tool.importlinter]: config imports no part, tasks neither parallel nor trainer, models neither
parallel nor the loop, collectives no metrics, the CLI no model code, no import cycles) and no
function in src/ above cyclomatic complexity 20 (radon's count)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import REPO

LIMIT = 20


def lint_imports(cwd: Path, src: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports")
    cmd = (
        [exe]
        if exe
        else [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()"]
    )
    env = {**os.environ, "PYTHONPATH": str(src)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_import_contract_holds():
    proc = lint_imports(REPO, REPO / "src")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "7 kept, 0 broken" in proc.stdout


def test_a_planted_violation_breaks_the_contract(tmp_path):
    """The same contract over a copy of src/ in which a task imports the trainer."""
    shutil.copytree(REPO / "src" / "paratrain", tmp_path / "src" / "paratrain")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = tmp_path / "src" / "paratrain" / "tasks" / "custom.py"
    planted.write_text(planted.read_text() + "\nfrom paratrain.trainer import run  # planted\n")
    proc = lint_imports(tmp_path, tmp_path / "src")
    assert proc.returncode != 0
    assert "tasks import neither parallel nor trainer BROKEN" in proc.stdout
    assert "paratrain.tasks.custom -> paratrain.trainer.run" in proc.stdout


def over_the_limit(source: str) -> list[str]:
    from radon.complexity import cc_visit
    from radon.visitors import Class

    found = []
    for block in cc_visit(source):
        stack = list(block.methods) if isinstance(block, Class) else [block]
        while stack:
            fn = stack.pop()
            if fn.complexity > LIMIT:
                found.append(f"{fn.name} ({fn.complexity})")
            stack += getattr(fn, "closures", [])
    return found


def test_no_function_above_complexity_20():
    found = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted((REPO / "src" / "paratrain").rglob("*.py"))
        for name in over_the_limit(path.read_text())
    ]
    assert not found, found


def test_the_complexity_count_can_fail():
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(LIMIT + 1))
    assert over_the_limit(f"def f(x):\n{branches}\n") == [f"f ({LIMIT + 2})"]
