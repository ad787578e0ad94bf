"""paratrain from Python (a notebook, a script): the same runs as `paratrain run`.

    import paratrain
    result = paratrain.train("recipes/tiny_lora_cpu.yaml", {"train.max_steps": 5})
    result["summary"]["tokens_per_s"]

A multi-process strategy starts its processes through the same torchrun path as the command
line and returns the result.json they wrote; a mistake raises paratrain.UserError with the
one line the command would print."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paratrain.config import RunConfig, load_config
from paratrain.errors import UserError, one_line


def config(recipe: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """A recipe (or the defaults) with dotted keys overridden: {"train.lr": 0.01}."""
    items = [f"{k}={_as_text(v)}" for k, v in (overrides or {}).items()]
    return load_config(recipe, items)


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value)
    return str(value)


def train(
    recipe: str | Path | RunConfig | None = None, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train as `paratrain run` does -> the run's result (result.json's contents)."""
    from paratrain.runner import execute, preflight
    from paratrain.trainer.loop import train as train_here

    cfg = recipe if isinstance(recipe, RunConfig) else config(recipe, overrides)
    try:
        if not cfg.multiprocess:
            preflight(cfg, 1)
            return train_here(cfg)
        if not cfg.output_dir:
            from paratrain.trainer.setup import default_output_dir

            cfg.output_dir = default_output_dir(cfg.name)
        if execute(cfg) != 0:
            raise RuntimeError("paratrain: training failed; the workers' errors are above")
    except UserError as e:
        raise UserError(one_line(e)) from None
    return json.loads((Path(cfg.output_dir) / "result.json").read_text())
