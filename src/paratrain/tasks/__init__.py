"""What is trained: a task owns its data, its loss, its evaluation, its metrics and its checks.

Each task module defines one `TASK` (protocols.Task): the data sources it reads, the layouts
and precisions it trains with, and three functions:

    check(cfg, layout)            its own settings against each other and the layout
                                  (ValueError naming the key), before anything runs
    preflight(cfg, layout, cuda)  what needs this machine or its files (UserError), once,
                                  before any process starts
    build(ctx) -> Workload        on every rank (ctx: protocols.BuildContext)

runplan.resolve picks the task (an explicit `task:`, or the first that reads data.source) and
refuses a layout or precision the task does not declare. Tasks never import parallel/ or
trainer/ and never read a strategy name: the trainer is the same for every task.
"""

from __future__ import annotations

import importlib
from typing import get_args

from paratrain.config.run import TaskName
from paratrain.protocols import Task

# One source: the names `task:` accepts (config/run.py's TaskName, which config may not import
# from here), in order (auto picks the first that reads data.source); tasks/<name>.py each.
TASKS = {name: f"paratrain.tasks.{name}" for name in get_args(TaskName) if name != "auto"}


def get_task(name: str) -> Task:
    return importlib.import_module(TASKS[name]).TASK


def counts_tokens(task: str) -> bool:
    """Whether the task counts tokens (tokens/s, MFU) rather than samples."""
    return get_task(task).counts_tokens


def resolve_task(task: str, data_source: str) -> Task:
    """`auto` -> the first task that reads data.source; an explicit task must read it (task
    custom reads none: its objects come from Python)."""
    if task == "custom":
        return get_task(task)
    readers = [get_task(t) for t in TASKS if data_source in get_task(t).reads]
    if task == "auto":
        return readers[0]
    chosen = get_task(task)
    if data_source not in chosen.reads:
        raise ValueError(
            f"data.source: task {task} does not read {data_source} (it reads "
            f"{', '.join(chosen.reads)}); {data_source} is read by "
            f"{', '.join(t.name for t in readers)}"
        )
    return chosen
