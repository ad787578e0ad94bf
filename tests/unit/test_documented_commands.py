"""Every command that README.md and docs/*.md show runs on a fresh clone as written, or says on
its own line what it needs (a GPU, your files): each `paratrain run` is resolved to its plan and
its task's preflight (files, data) without training; every other command parses, and every
file it names ships with the project, is made by a command above it on the same page, or is
called the user's on its line. The README's Train block then runs, top to bottom, in a fresh
copy of the recipes."""

import re
import shlex
from pathlib import Path

import pytest
import torch
from conftest import REPO

from paratrain.cli import build_parser
from paratrain.errors import UserError

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PAGES = [p for p in PAGES if p.name != "index.md"]  # the README again, for the site
SAYS_WHAT_IT_NEEDS = re.compile(r"\b(needs?|your|yours|GPUs?|on \d+ GPUs|with GPUs)\b", re.I)
MAKES = ("--output-dir", "--out", "--db")  # flags whose folder or file a command makes


def documented(page: Path) -> list[tuple[str, list[str], str]]:
    """(the line as shown, its argv, its comment) of each command in the page's bash blocks."""
    found = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            code, _, comment = line.partition(" #")
            if line.lstrip().startswith("#"):
                continue  # a comment line
            argv = shlex.split(code)
            if argv and (argv[0] == "paratrain" or argv[:3] == ["python", "-m", "paratrain"]):
                found.append((line.strip(), argv, comment))
    return found


def lacks(argv: list[str], made: set[str]) -> str | None:
    """What the command needs that a fresh clone does not have, or None."""
    if argv[0] == "python":  # python -m paratrain.<module>: importable
        module = argv[2]
        return None if __import__("importlib").util.find_spec(module) else f"no {module}"
    args = build_parser().parse_args(argv[1:])
    values = [a for i, a in enumerate(argv[2:], 2) if argv[i - 1] != "--set"]  # --set: preflight's
    named = [a for a in values if re.search(r"\.(ya?ml|json|db|csv|txt)$|/$", a)]
    outputs = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in MAKES}
    outputs |= {argv[3]} if argv[1] == "export" and len(argv) > 3 else set()
    for path in named:
        if path not in outputs and not (REPO / path).exists() and path not in made:
            return f"{path} does not exist"
    if argv[1] == "run" and not (args.list_keys or getattr(args, "print_config", False)):
        return _run_lacks(args, made)
    return None


def _run_lacks(args, made: set[str]) -> str | None:
    from paratrain.runplan import plan_of
    from paratrain.tasks import get_task

    if args.resume and args.resume not in made:
        return f"--resume {args.resume}: no command above makes it"
    if args.recipe is None:
        return None  # a resume of a folder made above: its own config
    overrides = [*args.overrides]
    overrides += [f"launch.nproc={args.nproc}"] if args.nproc else []
    try:
        plan = plan_of(str(REPO / args.recipe), overrides)
        if plan.device == "cuda" and not torch.cuda.is_available():
            return "a GPU"
        get_task(plan.task).preflight(plan.config, plan.layout, plan.device == "cuda")
    except UserError as e:  # a folder a command above makes is not here yet: fine
        return None if any(m in str(e) for m in made) else str(e)
    return None


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_documented_command_runs_here_or_says_what_it_needs(page, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes/ and data paths as a fresh clone has them
    made: set[str] = set()
    wrong = []
    for line, argv, comment in documented(page):
        missing = lacks(argv, made)
        if missing and not SAYS_WHAT_IT_NEEDS.search(comment):
            wrong.append(f"{line}\n    -> {missing}")
        made |= {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in MAKES}
        made |= {argv[3]} if argv[1:2] == ["export"] and len(argv) > 3 else set()  # its out/
    assert not wrong, "\n".join(wrong)


def test_the_readme_train_block_runs_as_written(tmp_path, monkeypatch):
    """The README's Train commands that need nothing of the user's, in order, in a fresh copy
    of the recipes, through the command's own entry point: each exits 0."""
    import shutil

    from paratrain.cli import main

    shutil.copytree(REPO / "recipes", tmp_path / "recipes")
    monkeypatch.chdir(tmp_path)
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Train", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    ran = 0
    for line in block.replace("\\\n", " ").splitlines():
        code, _, comment = line.partition(" #")
        if not code.strip() or SAYS_WHAT_IT_NEEDS.search(comment):
            continue
        assert main(shlex.split(code)[1:]) == 0, code
        ran += 1
    assert ran >= 4
