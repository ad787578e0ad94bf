"""Your own model, data set and loss, passed to paratrain.train from Python (task: custom).

    paratrain.train(None, {"strategy": "ddp-ds", "launch.nproc": 2},
                    model=Net(), train_data=train_set, val_data=held_out, loss=F.mse_loss)

The model is any nn.Module; a data set is map-style (len and indexing, so that the ranks can
share it through the sampler) and yields (input, target) pairs, tensors or tuples / dicts of
them; loss(output, target) returns the batch's mean (default: cross-entropy). Held out: the
mean loss, and accuracy where the output holds class scores [batch, classes] for integer
class targets [batch].

The objects reach a multi-process run's workers pickled by value (cloudpickle: classes defined
in a notebook or in the script itself travel too), in a file this process wrote for this
launch, named by PARATRAIN_OBJECTS. Parallelism is applied from outside the model as for any
other: DDP and FSDP2 (one unit per top-level child module); tensor parallelism, pipeline
stages and the layer split need a model family's spec and are refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from paratrain.config import data as data_keys
from paratrain.config.keys import dotted
from paratrain.data.loader import OnDevice, loader_workers, rank_loaders
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.protocols import BuildContext, FamilyTraits, Layout, Task, Workload

OBJECTS_ENV = "PARATRAIN_OBJECTS"
_here: dict[str, Any] | None = None  # the objects, in the process that was handed them


def hand_over(objects: dict[str, Any]) -> None:
    """The objects for a run in this process (and for write(), for its workers)."""
    global _here
    _here = objects


def write(path: Path) -> None:
    """The handed-over objects, pickled by value, for a launch's workers."""
    import cloudpickle

    with open(path, "wb") as f:
        cloudpickle.dump(_here, f)


def objects() -> dict[str, Any]:
    if _here is not None:
        return _here
    path = os.environ.get(OBJECTS_ENV)
    if not path:
        raise UserError(
            "task: custom trains the objects given to paratrain.train(model=..., "
            "train_data=...) from Python; from the command line name a model (model.name) "
            "and a data source (data.source)"
        )
    import pickle

    # Written a moment ago by the process that launched this one, for this launch: the
    # user's own objects (checkpoints, unlike this, are read without running any code).
    with open(path, "rb") as f:
        return pickle.load(f)


class CustomSpec:
    """A model paratrain knows nothing of: its top-level children are the blocks (FSDP's
    units, what activation checkpointing recomputes)."""

    family = "custom"
    traits = FamilyTraits(compiles=False)  # the user's own module: compiled only when asked

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return [m for m in model.children() if any(True for _ in m.parameters())]

    def _refuse(self, *_: Any, **__: Any):
        raise UserError(
            "strategy: a model passed from Python trains with single, dp, ddp-* or fsdp; "
            "tensor parallelism, pipeline stages and the split need a model paratrain knows"
        )

    pipeline_units = make_stage = make_stages = split_units = tp_plan = _refuse

    def flops_per_token(self, model: nn.Module, seq_len: int, lora: bool) -> None:
        return None


def check(cfg, layout: Layout) -> None:
    """Nothing of its own: the model, data and loss are the caller's objects."""


def preflight(cfg, layout: Layout, cuda: bool) -> None:
    got = objects()
    if not isinstance(got.get("model"), nn.Module):
        raise UserError(f"model: expected an nn.Module, got {type(got.get('model')).__name__}")
    for key in ("train_data", "val_data"):
        data = got.get(key)
        if data is not None and not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            raise UserError(
                f"{key}: expected a map-style Dataset (len and indexing), got {type(data).__name__}"
            )


def _moved(value: Any, device: torch.device, dtype: torch.dtype, non_blocking: bool) -> Any:
    """A batch on the device; floating inputs in the run's parameter dtype (fp64 runs)."""
    if isinstance(value, torch.Tensor):
        value = value.to(device, non_blocking=non_blocking)
        return value.to(dtype) if value.is_floating_point() and dtype != value.dtype else value
    if isinstance(value, (list, tuple)):
        return type(value)(_moved(v, device, dtype, non_blocking) for v in value)
    if isinstance(value, dict):
        return {k: _moved(v, device, dtype, non_blocking) for k, v in value.items()}
    return value


class Custom:
    """One rank's run of the user's objects: their model, data sets and loss, and what the
    trainer calls (loss, evaluate), built once by `build` (the tasks' one shape, as gan.py's)."""

    def __init__(self, ctx: BuildContext):
        cfg, policy, device = ctx.cfg, ctx.policy, ctx.device
        got = objects()
        self.train_set, val_set = got["train_data"], got.get("val_data")
        self.loss_fn = got.get("loss") or F.cross_entropy
        self.policy, self.device = policy, device
        d = cfg.data
        self.non_blocking = d.non_blocking
        if len(self.train_set) < ctx.loader_batch * ctx.dp_size:
            raise UserError(
                f"data.batch_size: {len(self.train_set)} training samples are fewer than one "
                f"batch on every data-parallel rank ({ctx.loader_batch} x {ctx.dp_size})"
            )
        self.model: nn.Module = got["model"].to(device=device, dtype=policy.param_dtype)
        self.val_rows = len(val_set) if val_set is not None else 0
        self.train, self.val, self.sampler = rank_loaders(
            self.train_set,
            val_set,
            d,
            sampler=ctx.layout.sampler,
            rank=ctx.dp_rank,
            world=ctx.dp_size,
            seed=cfg.seed,
            loader_batch=ctx.loader_batch,
            even_val=ctx.even_val,  # under FSDP every forward is a collective
            num_workers=loader_workers(d.num_workers),
            pin_memory=d.pin_memory and device.type == "cuda",
        )

    def on_device(self, loader):
        device, dtype, non_blocking = self.device, self.policy.param_dtype, self.non_blocking
        return OnDevice(loader, lambda batch: _moved(batch, device, dtype, non_blocking))

    def loss(self, model, batch):
        x, y = batch
        return self.loss_fn(model(x), y), None

    @torch.no_grad()
    def evaluate(self, model, loader) -> dict[str, float]:
        """Mean held-out loss (and accuracy for class scores), summed over ranks."""
        model.eval()
        device, loss_fn = self.device, self.loss_fn
        loss_sum = torch.zeros((), device=device, dtype=torch.float64)
        correct = torch.zeros((), device=device, dtype=torch.float64)
        count, classified = 0, True
        for x, y in loader:
            n = y.shape[0] if isinstance(y, torch.Tensor) else len(x)
            with self.policy.autocast():
                out = model(x)
                loss_sum += loss_fn(out, y).double() * n
            count += n
            scores = isinstance(out, torch.Tensor) and out.ndim == 2
            if scores and isinstance(y, torch.Tensor) and y.ndim == 1 and not y.is_floating_point():
                correct += (out.argmax(dim=1) == y).sum()
            else:
                classified = False
        # every rank must agree on whether accuracy means anything (a rank with no held-out
        # batch saw nothing to say no)
        flags = [loss_sum.item(), correct.item(), float(count), float(not classified and count > 0)]
        s, c, n, unclassified = pg.all_reduce_sum(flags, device)
        if n == 0:
            return {}
        out = {"val_loss": s / n}
        if not unclassified:
            out["val_accuracy"] = c / n
        return out

    def workload(self) -> Workload:
        loss_fn = self.loss_fn
        return Workload(
            model=self.model,
            spec=CustomSpec(),
            train=self.on_device(self.train),
            val=self.on_device(self.val) if self.val is not None else None,
            sampler=self.sampler,
            loss=self.loss,
            evaluate=self.evaluate,
            info={
                "data_real": True,
                "model_class": type(self.model).__name__,
                "train_samples": len(self.train_set),
                "loss": getattr(loss_fn, "__name__", type(loss_fn).__name__),
            },
            rows={"train": len(self.train_set), "val": self.val_rows},
            known_loss=getattr(loss_fn, "__module__", "").startswith("torch"),
        )


def build(ctx: BuildContext) -> Workload:
    return Custom(ctx).workload()


TASK = Task(
    name="custom",
    reads=(),
    layouts=frozenset({"single", "dp", "ddp", "fsdp"}),
    check=check,
    preflight=preflight,
    build=build,
    model_keys="python",
    describes="your model, data sets and loss from paratrain.train",
    family=CustomSpec.traits,
    # the objects came from Python: no model or data source is read
    unread=(
        "lora",
        "model",
        "gan",
        *dotted("data", (*data_keys.IMAGE_ONLY, *data_keys.TEXT_ONLY)),
        *dotted("data", ("source", "path", "limit_samples")),
    ),
)
