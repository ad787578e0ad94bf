"""Pipeline parallelism (strategy=pipeline): the model cut into consecutive stages, one per
process, with micro-batches flowing through them on a GPipe or 1F1B schedule
(torch.distributed.pipelining).

Each rank keeps the whole model object but replaces the blocks of other stages with
nn.Identity, so its parameters keep their names: the ranks' state dicts are disjoint parts of
the full model's, and a checkpoint merged from them loads into any strategy. Stage r receives
stage r-1's activations and sends its own on; the last stage computes the loss per micro-batch.
The schedule averages the gradients over micro-batches (scale_grads), so one step equals a
single-process step on the whole batch for a model whose result does not depend on how the batch
is split (no BatchNorm).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from paratrain import dist as pdist
from paratrain.errors import UserError


@dataclass(kw_only=True)
class PipelineConfig:
    """Pipeline parallelism's settings (strategy pipeline)."""

    microbatches: int = 4
    """Micro-batches per step: each stage works on one while the others work on the rest. More
    of them shrink the idle 'bubble' ((stages-1)/(microbatches+stages-1) of the step) but give
    each kernel less work. data.batch_size must divide by it."""
    schedule: Literal["gpipe", "1f1b"] = "1f1b"
    """gpipe: all forwards, then all backwards (activations of every micro-batch held at once);
    1f1b: one forward, one backward in turn once the pipe is full (at most `stages` held)."""
    boundaries: list[int] = field(default_factory=list)
    """Block indices where stages 2, 3, ... begin (one fewer than the stages), to balance the
    stages' compute by hand: MobileNetV2's early blocks work on large images with few weights.
    Empty: near-equal block counts."""

    def __post_init__(self) -> None:
        if self.microbatches < 1:
            raise ValueError(f"microbatches: must be >= 1, got {self.microbatches}")
        b = self.boundaries
        if any(x < 1 for x in b) or any(x >= y for x, y in zip(b, b[1:], strict=False)):
            raise ValueError(f"boundaries: must be increasing block indices >= 1, got {b}")


def _head_forward(model: nn.Module) -> Callable:
    import torchvision

    if isinstance(model, torchvision.models.MobileNetV2):
        return lambda m, x: m.classifier(torch.flatten(F.adaptive_avg_pool2d(x, (1, 1)), 1))
    if isinstance(model, torchvision.models.ResNet):
        return lambda m, x: m.fc(torch.flatten(m.avgpool(x), 1))
    if hasattr(model, "pool") and hasattr(model, "classifier"):  # paratrain's tiny CNN
        return lambda m, x: m.classifier(m.pool(x).flatten(1))
    raise UserError(
        "strategy: pipeline cuts MobileNetV2, ResNet-50 and the tiny CNN into stages; "
        f"{type(model).__name__} is none of them"
    )


def _stem_forward(m, x):  # ResNet's layers before layer1
    return m.maxpool(m.relu(m.bn1(m.conv1(x))))


def blocks_of(model: nn.Module) -> list[tuple[str, int | None]]:
    """The model's forward as a chain of blocks: (attribute of the model, index in it or None)."""
    _head_forward(model)  # raises for a model it does not know
    chain: list[tuple[str, int | None]] = []
    if isinstance(getattr(model, "features", None), nn.Sequential):
        chain += [("features", i) for i in range(len(model.features))]
    else:  # ResNet
        chain.append(("_stem", None))
        for i in range(1, 5):
            chain += [(f"layer{i}", j) for j in range(len(getattr(model, f"layer{i}")))]
    chain.append(("_head", None))
    return chain


def stage_ranges(n_blocks: int, stages: int, boundaries: list[int] | None = None) -> list[range]:
    """Consecutive runs of blocks, one per stage: cut at `boundaries`, else near-equal (the
    earlier stages one longer)."""
    if stages > n_blocks:
        raise UserError(
            f"launch.nproc: {stages} pipeline stages but the model has only {n_blocks} blocks"
        )
    if boundaries:
        if len(boundaries) != stages - 1 or boundaries[-1] >= n_blocks:
            raise UserError(
                f"pipeline.boundaries: {stages} stages need {stages - 1} increasing block "
                f"indices below {n_blocks}, got {boundaries}"
            )
        edges = [0, *boundaries, n_blocks]
        return [range(a, b) for a, b in zip(edges, edges[1:], strict=False)]
    base, extra = divmod(n_blocks, stages)
    out, start = [], 0
    for s in range(stages):
        length = base + (1 if s < extra else 0)
        out.append(range(start, start + length))
        start += length
    return out


def make_stage(
    model: nn.Module,
    stage: int,
    stages: int,
    boundaries: list[int] | None = None,
    channels_last: bool = False,
) -> nn.Module:
    """Turns `model` (in place) into stage `stage`: other stages' blocks become nn.Identity and
    forward runs this stage's blocks only. Parameter names stay the full model's.

    Stages send whole (contiguous) tensors. A channels_last activation is not contiguous in
    NCHW order, but its NHWC permutation is: a stage hands that on, and the next stage permutes
    back to a channels_last NCHW view, so neither side copies."""
    chain = blocks_of(model)
    mine = stage_ranges(len(chain), stages, boundaries)[stage]
    head_fn = types.MethodType(_head_forward(model), model)
    runs: list[Callable] = []
    for i, (attr, item) in enumerate(chain):
        owned = i in mine
        if attr == "_stem":
            if owned:
                runs.append(types.MethodType(_stem_forward, model))
            else:
                for name in ("conv1", "bn1"):
                    setattr(model, name, nn.Identity())
        elif attr == "_head":
            if owned:
                runs.append(head_fn)
            else:
                for name in ("classifier", "fc", "pool", "avgpool"):
                    if isinstance(getattr(model, name, None), nn.Module):
                        setattr(model, name, nn.Identity())
        else:
            container = getattr(model, attr)
            if owned:
                runs.append(container[item])
            else:
                container[item] = nn.Identity()

    def forward(self, x):
        if channels_last and stage > 0:
            x = x.permute(0, 3, 1, 2)  # NHWC as sent -> an NCHW view in channels_last layout
        for run in runs:
            x = run(x)
        if channels_last and stage < stages - 1:
            x = x.contiguous(memory_format=torch.channels_last).permute(0, 2, 3, 1)
        return x

    model.forward = types.MethodType(forward, model)
    return model


@dataclass
class Pipeline:
    """One rank's stage and its schedule; train_step and evaluate replace the loop's forward and
    backward for this strategy."""

    schedule: Any
    stage: int
    stages: int
    device: torch.device

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    def train_step(self, batch) -> torch.Tensor | None:
        """Forward and backward of one batch in micro-batches -> the mean loss on the last
        stage (None elsewhere)."""
        x, y = batch
        if self.first:
            self.schedule.step(x)
            return None
        if self.last:
            losses: list[torch.Tensor] = []
            self.schedule.step(target=y, losses=losses)
            return torch.stack([loss.detach() for loss in losses]).mean()
        self.schedule.step()
        return None

    @torch.no_grad()
    def evaluate(
        self, model: nn.Module, loader: Iterable, autocast, batch_size: int
    ) -> dict[str, float]:
        """Held-out accuracy: every stage runs the same batches; the last one counts. The stages
        exchange activations in buffers sized at the first step, so a short last batch is padded
        to the full size and only its real rows are counted."""
        model.eval()
        correct, total = 0.0, 0
        for x, y in loader:
            real = len(y)
            if real < batch_size:
                x = torch.cat([x, x.new_zeros((batch_size - real, *x.shape[1:]))])
                y = torch.cat([y, y.new_zeros(batch_size - real)])
            with autocast():
                if self.first:
                    self.schedule.eval(x)
                elif self.last:
                    out = self.schedule.eval(target=y, losses=[])
                    correct += (out[:real].argmax(dim=1) == y[:real]).sum().item()
                    total += real
                else:
                    self.schedule.eval()
        model.train()
        c, n = pdist.all_reduce_sum([correct, float(total)], self.device)
        return {"val_accuracy": c / max(n, 1)}


def build_pipeline(model: nn.Module, device: torch.device, cfg) -> Pipeline:
    """Cuts the model for this rank and attaches the schedule (after the model is on `device`)."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise UserError("strategy: pipeline needs at least 2 processes (one per stage)")
    make_stage(model, rank, world, cfg.pipeline.boundaries, cfg.train.channels_last)
    stage = PipelineStage(model, rank, world, device)
    kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cfg.pipeline.schedule]
    # the loss of each micro-batch (a mean over its samples); the schedule averages the gradients
    schedule = kind(stage, n_microbatches=cfg.pipeline.microbatches, loss_fn=F.cross_entropy)
    return Pipeline(schedule, rank, world, device)
