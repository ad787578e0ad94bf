"""Pipeline parallelism (parallel.pp > 1): the model cut into consecutive stages, one per rank
along the mesh's pp axis, with micro-batches flowing through them on a GPipe or 1F1B schedule
(torch.distributed.pipelining).

The cut comes from the model's spec (models/spec.py): each rank keeps the whole model object but
the units of other stages become parameterless nn.Identity, so its parameters keep their names:
the stages' state dicts are disjoint parts of the whole model's, and a checkpoint of them loads
into any layout. Stage s receives stage s-1's activations and sends its own on; the last stage
computes the loss per micro-batch with the task's summed loss divided by the whole batch's
count of loss terms (samples, or trained tokens), so a step equals a single-process step on the
whole batch, whatever the micro-batches hold (for models without BatchNorm, which normalises by
each micro-batch's own statistics).

Under data parallelism (PP x DP) each stage is wrapped in FSDP2 over its data-parallel ranks
(replicated, sharded or both; DDP's reducer expects one forward per backward and a schedule runs
several) before the PipelineStage is made; the schedule skips the gradient sync on all but the
last micro-batch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from paratrain.config.parallel import PipelineConfig
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.protocols import PipelineHooks


def stage_ranges(
    n_blocks: int,
    stages: int,
    boundaries: list[int] | None = None,
    keys: tuple[str, str] = ("parallel.pp", "pipeline.boundaries"),
) -> list[range]:
    """Consecutive runs of blocks, one per stage: cut at `boundaries`, else near-equal (the
    earlier stages one longer). `keys`: the settings an error names (the degree, the cuts)."""
    if stages > n_blocks:
        raise UserError(
            f"{keys[0]}: {stages} pipeline stages but the model has only {n_blocks} blocks"
        )
    if boundaries:
        if len(boundaries) != stages - 1 or boundaries[-1] >= n_blocks:
            raise UserError(
                f"{keys[1]}: {stages} stages need {stages - 1} increasing block "
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


def local_stages(dims, cfg: PipelineConfig) -> tuple[list[int], int]:
    """-> (the stage indices this rank holds, all stages): one per rank, or stages_per_rank
    looped ones (rank r: r, r + pp, ...), the order torch's interleaved schedules expect."""
    per_rank = cfg.stages_per_rank if cfg.schedule.startswith("interleaved") else 1
    return [dims.pp_rank + k * dims.pp for k in range(per_rank)], dims.pp * per_rank


def cut_stage(model: nn.Module, spec, dims, cfg: PipelineConfig, **options: Any) -> list[nn.Module]:
    """This rank's stages of `model`, cut in place (before tensor parallelism and wrapping):
    [model] itself for one stage per rank; under an interleaved schedule one module per stage,
    each sharing `model`'s layers (so `model` stays what checkpoints and the optimizer see)."""
    mine, total = local_stages(dims, cfg)
    keys = ("parallel.pp" if len(mine) == 1 else "pipeline.stages_per_rank", "pipeline.boundaries")
    ranges = stage_ranges(spec.pipeline_units(model), total, cfg.boundaries, keys)
    if len(mine) == 1:
        return [spec.make_stage(model, ranges[mine[0]], mine[0], total, **options)]
    return spec.make_stages(model, [(s, ranges[s]) for s in mine], total, **options)


@dataclass
class Pipeline:
    """One rank's stage and its schedule; train_step and evaluate replace the loop's forward and
    backward for this rank."""

    schedule: Any
    stage: int
    """This rank's place on the pp axis (it holds stage `stage`, and under an interleaved
    schedule also stage + pp, ...)."""
    stages: int
    """Ranks on the pp axis."""
    device: torch.device
    hooks: PipelineHooks
    denominator: list = field(default_factory=lambda: [1])
    """The current batch's count of loss terms, read by the schedule's loss function."""
    tied: TiedCopies | None = None
    """A weight the model uses on the first and the last stage (a tied lm_head)."""

    @property
    def first(self) -> bool:  # holds the first stage: takes the inputs
        return self.stage == 0

    @property
    def last(self) -> bool:  # holds the last stage: computes the loss
        return self.stage == self.stages - 1

    def train_step(self, batch) -> torch.Tensor | None:
        """Forward and backward of one batch in micro-batches -> the batch's mean loss on the
        last stage (None elsewhere)."""
        inputs, target, count = self.hooks.split(batch)
        loss = None
        if self.first:
            self.schedule.step(inputs)
        elif self.last:
            self.denominator[0] = count
            losses: list[torch.Tensor] = []
            self.schedule.step(target=target, losses=losses)
            loss = torch.stack([loss.detach() for loss in losses]).sum()
        else:
            self.schedule.step()
        if self.tied is not None:
            self.tied.sum_grads()
        return loss

    @torch.no_grad()
    def evaluate(self, model: nn.Module, loader: Iterable, autocast, batch_size: int):
        """Held-out metrics: every stage runs the same batches; the last one scores them. The
        stages exchange activations in buffers sized at the first step, so a short last batch
        is padded to the full size and only its real rows are scored."""
        model.eval()
        sums: dict[str, float] = {}
        for batch in loader:
            inputs, target, _ = self.hooks.split(batch)
            real = len(target)
            if real < batch_size:
                inputs = _pad_rows(inputs, batch_size)
                target = _pad_rows(target, batch_size)
            with autocast():
                if self.first:
                    self.schedule.eval(inputs)
                elif self.last:
                    self.denominator[0] = 1
                    out = self.schedule.eval(target=target, losses=[])
                    for key, value in self.hooks.score(out[:real], target[:real]).items():
                        sums[key] = sums.get(key, 0.0) + float(value)
                else:
                    self.schedule.eval()
        model.train()
        keys = self.hooks.score_keys
        totals = pg.all_reduce_sum([sums.get(k, 0.0) for k in keys], self.device)
        return self.hooks.summarize(dict(zip(keys, totals, strict=True)))


def tied_names(model: nn.Module) -> list[list[str]]:
    """The names of each parameter that several modules hold (a tied lm_head and embedding),
    read from the whole model before it is cut into stages."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [n for n in names.values() if len(n) > 1]


@dataclass
class TiedCopies:
    """A weight used by the first stage (the embedding) and the last (lm_head) exists on both
    ranks as two copies, built equal. Each stage's backward gives its copy the gradient of its
    own use; the weight's gradient is their sum (Megatron-LM's embedding group does the same),
    so both copies are given it, on a group of the two ranks, and take the same optimizer step."""

    params: list
    """This rank's copies (none on the stages between)."""
    group: Any
    aliases: dict[str, list[str]] = field(default_factory=dict)
    """{the name of this rank's copy: the weight's other names} (checkpoint.load_checkpoint)."""

    def sum_grads(self) -> None:
        import torch.distributed as dist

        for p in self.params:
            if p.grad is not None:  # a DTensor's shard (FSDP, TP) matches its peer's shard
                grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                dist.all_reduce(grad, group=self.group)


def tied_copies(model: nn.Module, tied: list[list[str]], dims) -> TiedCopies | None:
    """Every rank makes the groups (torch's new_group is collective): one per line of the pp
    axis, its first and last rank, which hold the same shard of the copies under FSDP or TP."""
    import torch.distributed as dist

    if not tied:
        return None
    ranks = dims.mesh.mesh  # [pp, dp_replicate, dp_shard, tp]
    lines = ranks.reshape(dims.pp, -1).t().tolist()
    group = None
    for line in lines:
        g = dist.new_group([line[0], line[-1]])
        if dist.get_rank() in (line[0], line[-1]):
            group = g
    names = {n: [o for o in same if o != n] for same in tied for n in same}
    mine = [(n, p) for n, p in model.named_parameters() if n in names and p.requires_grad]
    return TiedCopies([p for _, p in mine], group, {n: names[n] for n, _ in mine})


def _pad_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.cat([t, t.new_zeros((rows - len(t), *t.shape[1:]))])


def build_schedule(
    stage_modules: list[nn.Module],
    dims,
    device: torch.device,
    cfg: PipelineConfig,
    hooks: PipelineHooks,
    tied: TiedCopies | None = None,
) -> Pipeline:
    """The PipelineStages over this rank's (wrapped) stage modules and their schedule."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    mine, total = local_stages(dims, cfg)
    group = dims.submesh("pp").get_group()
    stages = [
        PipelineStage(module, index, total, device, group=group)
        for module, index in zip(stage_modules, mine, strict=True)
    ]
    pipe = Pipeline(None, dims.pp_rank, dims.pp, device, hooks, tied=tied)

    def loss_fn(output, target):
        # summed over the micro-batch, divided by the whole batch's count: the micro-batches'
        # gradients then add up to the batch mean's (hence scale_grads=False)
        return hooks.loss_sum(output, target) / pipe.denominator[0]

    options = dict(n_microbatches=cfg.microbatches, loss_fn=loss_fn, scale_grads=False)
    if cfg.schedule == "interleaved-1f1b":
        pipe.schedule = ScheduleInterleaved1F1B(stages, **options)
    else:
        kind = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cfg.schedule]
        pipe.schedule = kind(stages[0], **options)
    return pipe
