"""paratrain from Python (a notebook, a script): the same runs as `paratrain run`.

    import paratrain
    result = paratrain.train("recipes/tiny_lora_cpu.yaml", {"train.max_steps": 5})
    result["summary"]["tokens_per_s"]

A multi-process strategy starts its processes through the same torchrun path as the command
line and returns the result.json they wrote; a mistake raises paratrain.UserError with the
one line the command would print.

Your own objects instead of a recipe's model and data (task custom, tasks/custom.py):

    result = paratrain.train(None, {"strategy": "ddp-ds", "launch.nproc": 2},
                             model=net, train_data=train_set, val_data=val_set, loss=F.mse_loss)

`net` holds the trained weights when train returns, however many processes trained it."""

from __future__ import annotations

import contextlib
import json
import os
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
    recipe: str | Path | RunConfig | None = None,
    overrides: dict[str, Any] | None = None,
    *,
    model: Any = None,
    train_data: Any = None,
    val_data: Any = None,
    loss: Any = None,
    overwrite: bool = False,
    trust_code: bool = False,
) -> dict[str, Any]:
    """Train as `paratrain run` does -> the run's result (result.json's contents). model,
    train_data (and val_data, loss): your own nn.Module, map-style Datasets of (input, target)
    and loss(output, target) instead of the recipe's (task custom). overwrite: an earlier run
    in output_dir is replaced (`paratrain run --overwrite`), else refused. trust_code: a
    `module:function` the recipe names is imported even when it is no file of yours
    (`paratrain run --trust-code`; objects passed here need no trust)."""
    with _trusting(trust_code), _config_folder(recipe):
        return _train(recipe, overrides, model, train_data, val_data, loss, overwrite)


def _config_folder(recipe):
    """A recipe that is a run folder's config.yaml is read as `paratrain run --resume` reads it:
    what lies beside that folder came with it (trust.py); for this call only."""
    from paratrain.trust import reading_config_of, run_folder_of

    if isinstance(recipe, (str, Path)):
        return reading_config_of(run_folder_of(recipe))
    return contextlib.nullcontext()  # a RunConfig or a shipped recipe's name: no file of a run


@contextlib.contextmanager
def _trusting(trust_code: bool):
    """--trust-code for this call: the variable its workers inherit, as it was afterwards."""
    from paratrain.trust import TRUST_ENV

    before = os.environ.get(TRUST_ENV)
    if trust_code:
        os.environ[TRUST_ENV] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(TRUST_ENV, None)
        else:
            os.environ[TRUST_ENV] = before


def _train(recipe, overrides, model, train_data, val_data, loss, overwrite) -> dict[str, Any]:
    from paratrain.runner import execute, with_output_dir
    from paratrain.runplan import resolve

    given = {"model": model, "train_data": train_data, "val_data": val_data, "loss": loss}
    custom = any(v is not None for v in given.values())
    try:
        if custom and (model is None or train_data is None):
            raise UserError(
                "paratrain.train: model= and train_data= go together (val_data= "
                "and loss= are optional)"
            )
        if custom and isinstance(recipe, RunConfig):
            raise UserError(
                "paratrain.train: with model= and train_data=, give a recipe path (or None) and "
                "overrides, not a RunConfig (its task is already resolved)"
            )
        if custom:
            overrides = {**(overrides or {}), "task": "custom"}
        cfg = recipe if isinstance(recipe, RunConfig) else config(recipe, overrides)
        plan = with_output_dir(resolve(cfg, given=list(overrides or {})))
        if custom:
            return _train_objects(plan, given, overwrite)
        if execute(plan, overwrite) != 0:
            raise RuntimeError("paratrain: training failed; the workers' errors are above")
    except UserError as e:
        raise UserError(one_line(e)) from None
    return _result(plan)


def _result(plan) -> dict[str, Any]:
    return json.loads((Path(plan.config.output_dir) / "result.json").read_text())


def _train_objects(plan, given: dict[str, Any], overwrite: bool) -> dict[str, Any]:
    """Task custom: in this process the objects train in place; several processes get them
    pickled by value and the trained weights come back into `model` from the final
    checkpoint."""
    import sys
    import tempfile

    from paratrain.runner import execute
    from paratrain.tasks import custom

    cfg = plan.config
    custom.hand_over(given)
    try:
        if not plan.multiprocess:
            execute(plan, overwrite)
            return _result(plan)
        if not cfg.checkpoint.at_end:
            raise UserError(
                "checkpoint.at_end: several processes train copies of the model; their final "
                "checkpoint is how the trained weights come back into it: leave it true"
            )

        saved = {k: os.environ.get(k) for k in (custom.OBJECTS_ENV, "PYTHONPATH")}
        with tempfile.TemporaryDirectory(prefix="paratrain-objects-") as scratch:
            path = Path(scratch) / "objects.pkl"
            custom.write(path)
            os.environ[custom.OBJECTS_ENV] = str(path)
            # classes the objects name by module (a module beside the calling script, or in a
            # notebook's folder: '' here) import in the workers as here (their own sys.path
            # leaves the working directory out: launch.safe_path)
            here = [p or os.getcwd() for p in sys.path if Path(p or ".").is_dir()]
            os.environ["PYTHONPATH"] = os.pathsep.join(
                [*here, *filter(None, [saved["PYTHONPATH"]])]
            )
            try:
                code = execute(plan, overwrite)
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        if code != 0:
            raise RuntimeError("paratrain: training failed; the workers' errors are above")
        _load_final(given["model"], cfg)
    finally:
        custom.hand_over(None)
    return _result(plan)


def _load_final(model, cfg: RunConfig) -> None:
    """The final checkpoint's weights into the model given (checkpoints leave frozen
    parameters out: those the model holds already)."""
    from paratrain.checkpoint import read_checkpoint, resolve_resume
    from paratrain.launch.runfolder import checkpoint_dir

    where = checkpoint_dir(cfg, Path(cfg.output_dir))
    state = read_checkpoint(resolve_resume(where))
    missing, unexpected = model.load_state_dict(state["model"], strict=False)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    if unexpected or any(k in trainable for k in missing):
        raise RuntimeError(
            f"paratrain: the final checkpoint in {where} does not fit the model given "
            f"(missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
