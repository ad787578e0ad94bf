"""The shape of the code, held by the test command: the import contract (pyproject.toml's
[tool.importlinter]: config imports no part, tasks neither parallel nor trainer, models neither
parallel nor the loop nor the data, optim and kernels no model code, the trainer not the plan,
collectives no metrics, the CLI no model code (but through its commands' functions), no import
cycles; each fails when a violation is planted), no task named outside tasks/ and bench/, and
no function in src/ above cyclomatic complexity 20 (radon's count)."""

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
    assert "9 kept, 0 broken" in proc.stdout


# A violation of each contract, planted at the end of a module: (module, the line, what
# lint-imports then names: the contract BROKEN and the import it found)
PLANTED = [
    (
        "config/keys.py",
        "from paratrain.metrics import peak_memory_bytes",
        "config imports no part of paratrain",
        "paratrain.config.keys -> paratrain.metrics",
    ),
    (
        "config/run.py",
        "from paratrain import profiling, precision",
        "config imports no part of paratrain",
        "paratrain.config.run -> paratrain.precision",
    ),
    (
        "config/gan.py",
        "from paratrain.optim import master_adamw",
        "config imports no part of paratrain",
        "paratrain.config.gan -> paratrain.optim",
    ),
    (
        "tasks/custom.py",
        "from paratrain.trainer import run",
        "tasks import neither parallel nor trainer",
        "paratrain.tasks.custom -> paratrain.trainer.run",
    ),
    (
        "models/gan.py",
        "from paratrain.data import loader",
        "models import neither parallel nor the loop nor the data",
        "paratrain.models.gan -> paratrain.data.loader",
    ),
    (
        "optim/master_adamw.py",
        "from paratrain.models import swap",
        "optim and kernels import no model code",
        "paratrain.optim.master_adamw -> paratrain.models.swap",
    ),
    (
        "trainer/result.py",
        "from paratrain.runplan.strategies import STRATEGIES",
        "the trainer does not re-enter the plan",
        "paratrain.trainer.result -> paratrain.runplan.strategies",
    ),
    # the package root's paratrain.train reaches api.py: the hidden route the version took
    (
        "trainer/steplog.py",
        "from paratrain import __version__",
        "the trainer does not re-enter the plan",
        "paratrain.trainer.steplog -> paratrain (l.",
    ),
    (
        "distributed/process_group.py",
        "from paratrain import metrics",
        "distributed and collectives import no metrics",
        "paratrain.distributed.process_group -> paratrain.metrics",
    ),
    (
        "parallel/ac.py",
        "from paratrain.tasks import get_task",
        "parallel imports no task and no trainer",
        "paratrain.parallel.ac -> paratrain.tasks",
    ),
    # indirect: the CLI's report command through a helper that reaches the tasks
    (
        "cli/report.py",
        "from paratrain.trainer import result",
        "the CLI imports no model code",
        "paratrain.cli.report -> paratrain.trainer.result",
    ),
    (
        "metrics.py",
        "from paratrain.trainer import steplog",
        "no import cycles",
        ".metrics -> .trainer",
    ),
]


def broken(stdout: str) -> dict[str, str]:
    """lint-imports' report of each broken contract, by the contract's name."""
    text = stdout.split("Broken contracts", 1)[1]
    parts = re.split(r"^(.+)\n-{3,}\n", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def test_each_contract_breaks_when_a_violation_is_planted(tmp_path):
    """The same contract over a copy of src/ with one violation of each contract planted: every
    contract is broken, each naming the import planted."""
    shutil.copytree(REPO / "src" / "paratrain", tmp_path / "src" / "paratrain")
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    for module, line, _, _ in PLANTED:
        planted = tmp_path / "src" / "paratrain" / module
        planted.write_text(planted.read_text() + f"\n{line}  # planted\n")
    proc = lint_imports(tmp_path, tmp_path / "src")
    assert proc.returncode != 0
    contracts = {contract for _, _, contract, _ in PLANTED}
    assert f"0 kept, {len(contracts)} broken" in proc.stdout, proc.stdout
    reports = broken(proc.stdout)
    assert set(reports) == contracts, list(reports)
    for _, _, contract, found in PLANTED:
        assert found in reports[contract], (found, reports[contract])


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
