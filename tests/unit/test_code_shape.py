"""The shape of the code, held by the test command: the import contract (pyproject.toml's
[tool.importlinter]: the parts layered, model code reached through tasks, models reading no
data, optim no model code, the CLI no model code (but through its commands' functions), no
import cycles; each fails when a violation is planted), no task named outside tasks/ and bench/, and
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
    assert "6 kept, 0 broken" in proc.stdout


# A violation of each contract, planted at the end of a module: (module, the line, what
# lint-imports then names: the contract BROKEN and the import it found)
LAYERS = "the parts are layered"
THROUGH_TASKS = "model code is reached through tasks"
PLANTED = [
    (
        "config/keys.py",
        "from paratrain.meters.metrics import peak_memory_bytes",
        LAYERS,
        "paratrain.config.keys -> paratrain.meters.metrics",
    ),
    (
        "config/run.py",
        "from paratrain.trainer import precision",
        LAYERS,
        "paratrain.config.run -> paratrain.trainer.precision",
    ),
    (
        "tasks/custom.py",
        "from paratrain.trainer import built",
        LAYERS,
        "paratrain.tasks.custom -> paratrain.trainer.built",
    ),
    (
        "models/gan.py",
        "from paratrain.data import loader",
        "models read no data",
        "paratrain.models.gan -> paratrain.data.loader",
    ),
    (
        "optim/master_adamw.py",
        "from paratrain.models import swap",
        "optim imports no model code",
        "paratrain.optim.master_adamw -> paratrain.models.swap",
    ),
    (
        "trainer/result.py",
        "from paratrain.runplan.strategies import STRATEGIES",
        LAYERS,
        "paratrain.trainer.result -> paratrain.runplan.strategies",
    ),
    # the package root's paratrain.train reaches api.py: the hidden route the version took
    (
        "trainer/steplog.py",
        "from paratrain import __version__",
        LAYERS,
        "paratrain.trainer.steplog -> paratrain (l.",
    ),
    (
        "distributed/process_group.py",
        "from paratrain.meters import metrics",
        LAYERS,
        "paratrain.distributed.process_group -> paratrain.meters.metrics",
    ),
    (
        "parallel/ac.py",
        "from paratrain.tasks import get_task",
        LAYERS,
        "paratrain.parallel.ac -> paratrain.tasks",
    ),
    # the plan resolves a run; it never imports the loop that runs it
    (
        "runplan/checks.py",
        "from paratrain.trainer import steplog",
        LAYERS,
        "paratrain.runplan.checks -> paratrain.trainer.steplog",
    ),
    (
        "trainer/setup.py",
        "from paratrain.models import spec",
        THROUGH_TASKS,
        "paratrain.trainer.setup -> paratrain.models.spec",
    ),
    (
        "runner.py",
        "from paratrain.models.causal_lm import build",
        THROUGH_TASKS,
        "paratrain.runner -> paratrain.models.causal_lm.build",
    ),
    (
        "api.py",
        "from paratrain.models import swap",
        THROUGH_TASKS,
        "paratrain.api -> paratrain.models.swap",
    ),
    # indirect: the CLI's report command through a helper that reaches the tasks
    (
        "cli/report.py",
        "from paratrain.trainer import result",
        "the CLI imports no model code",
        "paratrain.cli.report -> paratrain.trainer.result",
    ),
    # a cycle inside one part, which the layers (between parts) do not see
    (
        "trainer/steplog.py",
        "from paratrain.trainer import trainer",
        "no import cycles",
        "No cycles are allowed in paratrain.trainer.",
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


def test_no_model_family_named_outside_models():
    """Outside models/ (each family's own folder) and bench/peers/ (the peers' own programs),
    nothing branches on a model family's name (`model_type != "llama"`, `family == "gpt2"`): it
    asks the family's record (models/causal_lm/family.py: levers_measured, analytic, ...)."""
    from paratrain.models.causal_lm.family import FAMILIES

    root = REPO / "src" / "paratrain"
    found = [
        f"{path.relative_to(REPO)}: {line}"
        for path in sorted(root.rglob("*.py"))
        if path.relative_to(root).parts[0] != "models"
        and path.relative_to(root).parts[:2] != ("bench", "peers")
        for line in task_name_comparisons(path.read_text(), FAMILIES)
    ]
    assert not found, found


def test_the_family_name_check_can_fail():
    planted = 'if family(cfg) != "llama":\nok = fields.get("model_type", "llama") == "llama"\n'
    assert len(task_name_comparisons(planted, ["llama", "gpt2"])) == 2


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


def private_imports_across_parts(root: Path) -> list[str]:
    """`from paratrain.<part>... import _name` in a module of another part: a private helper
    one part borrowed from another (a part's own modules may share theirs)."""
    found = []
    pattern = re.compile(r"^\s*from paratrain\.(\w+)[\w.]* import (.+)$", re.M)
    for path in sorted(root.rglob("*.py")):
        part = path.relative_to(root).parts[0].removesuffix(".py")
        for m in pattern.finditer(path.read_text()):
            names = [n.strip().split(" as ")[0] for n in m.group(2).strip("()").split(",")]
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if m.group(1) != part and private:
                found.append(f"{path.relative_to(root)}: {m.group(0).strip()}")
    return found


def test_no_part_imports_another_parts_private_names(tmp_path):
    assert not private_imports_across_parts(REPO / "src" / "paratrain")
    planted = tmp_path / "forecast" / "calibrate.py"
    planted.parent.mkdir()
    planted.write_text("from paratrain.bench.execute import _tail\n")
    assert private_imports_across_parts(tmp_path) == [
        "forecast/calibrate.py: from paratrain.bench.execute import _tail"
    ]
