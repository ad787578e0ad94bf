"""The shape of the code, held by the test command: the import contract (pyproject.toml's
[tool.importlinter]: config imports no part, tasks neither parallel nor trainer, models neither
parallel nor the loop, collectives no metrics, the CLI no model code, no import cycles) and no
function in src/ above cyclomatic complexity 20 (radon's count)."""

import os
import re
import shutil
import subprocess
import sys
import typing
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


def task_name_comparisons(source: str, names) -> list[str]:
    """Lines that ask a task by name (`task == "gan"`, `task in ("causal_lm", ...)`): a question
    that belongs in a field the Task declares (protocols.Task)."""
    quoted = "|".join(re.escape(n) for n in names)
    pattern = re.compile(
        rf"""[=!]=\s*["']({quoted})["']|["']({quoted})["']\s*[=!]="""
        rf"""|\bin\s*[(\[{{][^)\]}}]*["']({quoted})["']"""
    )
    return [line.strip() for line in source.splitlines() if pattern.search(line)]


def test_no_task_named_outside_tasks_and_bench():
    """Outside tasks/ (the tasks themselves) and bench/ (the peers' own programs), nothing
    branches on a task's name: it reads what the Task declares."""
    from paratrain.tasks import TASKS

    root = REPO / "src" / "paratrain"
    found = [
        f"{path.relative_to(REPO)}: {line}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).parts[0] not in ("tasks", "bench")
        for line in task_name_comparisons(path.read_text(), TASKS)
    ]
    assert not found, found


def test_the_task_name_check_can_fail():
    names = ["causal_lm", "gan"]
    planted = (
        'if plan.task == "causal_lm":\n'
        "ok = task != 'gan'\n"
        'lm = cfg.task in ("masked_lm", "causal_lm")\n'
        'family = "gan"\n'  # an assignment: not a question
        'x = {"task": "gan"}\n'
    )
    assert task_name_comparisons(planted, names) == [
        'if plan.task == "causal_lm":',
        "ok = task != 'gan'",
        'lm = cfg.task in ("masked_lm", "causal_lm")',
    ]


def test_the_task_names_have_one_source():
    """`task:` accepts (config/run.py's TaskName) what TASKS holds, and each name's module
    declares a Task of that name."""
    from paratrain.config import TaskName
    from paratrain.tasks import TASKS, get_task

    assert ("auto", *TASKS) == typing.get_args(TaskName)
    assert all(get_task(name).name == name for name in TASKS)


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
