"""Strategy names as shorthands for the degrees of the mesh, a data-parallel wrapper and a
sampler: the only place a strategy name is read.

A run's parallelism is four degrees (parallel.dp_replicate, dp_shard, tp, pp) whose product is
the number of processes, plus a sampler mode (data.sampler). `strategy` names a common setting
of them: ddp-ds is dp_replicate over every rank with torch's DistributedSampler, fsdp is
dp_shard over every rank, pipeline is pp over every rank, and so on. A shorthand fills in only
what the user left at its default, so `strategy=fsdp parallel.tp=2` on 8 ranks is FSDP over 4
and tensor parallel over 2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, get_args

from paratrain.config.parallel import ParallelConfig
from paratrain.config.run import Strategy
from paratrain.distributed.parallel_dims import resolve_degrees


@dataclass(frozen=True)
class Shorthand:
    doc: str
    axis: str | None = None
    """The degree that takes the ranks the others leave (-1); None: none (one process, or for
    auto whatever the degrees say)."""
    sampler: Literal["distributed", "round-robin", "full"] = "distributed"
    wrapper: Literal["ddp", "fsdp", "data-parallel", None] = None
    """The data-parallel wrapper this name means, even on one rank (ddp-* runs DDP, fsdp runs
    fully_shard); None lets the degrees decide (wrapper_for)."""


STRATEGIES: dict[str, Shorthand] = {
    "auto": Shorthand(
        "the degrees decide; with none set, one process (or ddp-ds for launch.nproc > 1)"
    ),
    "single": Shorthand("one device, one process"),
    "dp": Shorthand(
        "torch.nn.DataParallel: one process scatters each batch over all visible GPUs",
        wrapper="data-parallel",
    ),
    "ddp-full": Shorthand(
        "DDP, every rank iterates the WHOLE data set (seed's 'DDP'): redundant work",
        axis="dp_replicate",
        sampler="full",
        wrapper="ddp",
    ),
    "ddp-rr": Shorthand(
        "DDP, rank r takes samples r, r+W, r+2W, ... of the whole data set (seed's DDP-RR)",
        axis="dp_replicate",
        sampler="round-robin",
        wrapper="ddp",
    ),
    "ddp-ds": Shorthand(
        "DDP with torch's DistributedSampler, set_epoch every epoch (seed's DDP-DS)",
        axis="dp_replicate",
        wrapper="ddp",
    ),
    "fsdp": Shorthand(
        "FSDP2: fully_shard per block; weights, gradients and optimizer state sharded over ranks",
        axis="dp_shard",
        wrapper="fsdp",
    ),
    "tp": Shorthand(
        "tensor parallel: each decoder layer's projections split over the ranks (language models)",
        axis="tp",
    ),
    "pipeline": Shorthand(
        "pipeline parallelism: the model cut into one stage per rank, micro-batches on a GPipe "
        "or 1F1B schedule",
        axis="pp",
    ),
    "split": Shorthand(
        "the seeds' model parallelism: consecutive blocks of one model on different GPUs of one "
        "process, one batch at a time (each GPU idle while the others compute)"
    ),
}
# the names config.run.Strategy accepts, one list: config imports nothing above it, so it is
# checked here, where both are seen
assert set(STRATEGIES) == set(get_args(Strategy)), set(STRATEGIES) ^ set(get_args(Strategy))

ONE_PROCESS = ("single", "dp", "split")


def trivial(p: ParallelConfig) -> bool:
    """No degree set: the strategy (or the process count) decides."""
    return p.dp_replicate in (None, 1) and (p.dp_shard, p.tp, p.pp) == (1, 1, 1)


def set_degrees(p: ParallelConfig) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.degrees().items() if v not in (None, 1)) or "none"


def shorthand(cfg, several: bool) -> tuple[str, str]:
    """-> (strategy, sampler): `auto` made concrete where the degrees leave it open (one
    process, or ddp-* for several: `several`), and the sampler its shorthand names."""
    strategy, p, asked = cfg.strategy, cfg.parallel, cfg.data.sampler
    if strategy == "auto" and trivial(p):
        by_sampler = {"full": "ddp-full", "round-robin": "ddp-rr"}
        strategy = by_sampler.get(asked, "ddp-ds") if several else "single"
    short = STRATEGIES[strategy]
    if asked == "auto":
        return strategy, short.sampler
    if short.wrapper == "ddp" and asked != short.sampler:
        raise ValueError(
            f"data.sampler: strategy {strategy} reads with the {short.sampler} "
            f"sampler, got {asked}; leave data.sampler at auto"
        )
    return strategy, asked


def check_shape(cfg, strategy: str, launches_several: bool) -> None:
    """What a shorthand cannot be combined with."""
    p, launch = cfg.parallel, cfg.launch
    if strategy in ONE_PROCESS:
        if launches_several:
            raise ValueError(
                f"launch.nproc: strategy {strategy} runs in one process, got "
                f"nproc={launch.nproc} nnodes={launch.nnodes}; use ddp-ds (or ddp-rr, "
                "ddp-full) for several"
            )
        if not trivial(p):
            raise ValueError(
                f"strategy: {strategy} runs in one process; the parallel.* degrees set "
                f"({set_degrees(p)}) need several (strategy auto lets them decide)"
            )
    elif STRATEGIES[strategy].wrapper == "ddp" and (p.dp_shard, p.tp, p.pp) != (1, 1, 1):
        raise ValueError(
            f"strategy: {strategy} replicates whole models (DDP), which holds no sharded "
            f"or tensor-parallel weights and no pipeline schedule ({set_degrees(p)}); use "
            "strategy=auto (replicas then come from FSDP2) or fsdp"
        )


def degrees_for(cfg, strategy: str, world: int) -> dict[str, int]:
    """The four degrees for `world` ranks: the shorthand's axis takes the ranks the others
    leave, unless a degree is already -1 (ValueError naming the key when they do not fit)."""
    if strategy in ONE_PROCESS:
        return {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "tp": 1}
    p = dataclasses.replace(cfg.parallel)
    axis = STRATEGIES[strategy].axis
    inferred = any(v == -1 for v in p.degrees().values())
    # this axis takes the ranks the others leave (dp_replicate's null already does)
    if axis not in (None, "dp_replicate") and not inferred and getattr(p, axis) == 1:
        setattr(p, axis, -1)
    return resolve_degrees(p, world)


def wrapper_for(strategy: str, degrees: dict[str, int]) -> str | None:
    """Which wrapper the data-parallel axes take. DDP holds neither DTensor weights (tensor
    parallelism) nor a pipeline schedule's several forwards before each backward (its reducer
    expects one), so there the replicated axis is FSDP2's too, on a dp_replicate x dp_shard mesh
    whose dp_shard of 1 shards nothing."""
    named = STRATEGIES[strategy].wrapper
    if named == "data-parallel":
        return named
    if degrees["dp_shard"] > 1 or named == "fsdp":
        return "fsdp"
    if degrees["dp_replicate"] > 1:
        return "fsdp" if degrees["tp"] > 1 or degrees["pp"] > 1 else "ddp"
    return named


def uses(strategy: str, degrees: dict[str, int], wrapper: str | None) -> frozenset[str]:
    """The layouts (protocols.LAYOUTS) a run combines."""
    found = {"dp": wrapper == "data-parallel", "ddp": wrapper == "ddp", "fsdp": wrapper == "fsdp"}
    found["tp"] = degrees["tp"] > 1 or strategy == "tp"
    found["pp"] = degrees["pp"] > 1 or strategy == "pipeline"
    found["split"] = strategy == "split"
    return frozenset(k for k, v in found.items() if v) or frozenset({"single"})


def label(strategy: str, degrees: dict[str, int]) -> str:
    """The strategy named, or for `auto` the parallelisms the degrees make."""
    if strategy != "auto":
        return strategy
    parts = []
    if degrees["dp_shard"] > 1:
        parts.append("hsdp" if degrees["dp_replicate"] > 1 else "fsdp")
    elif degrees["dp_replicate"] > 1:  # replicated (DDP, or FSDP2 beside tp / pp)
        parts.append("ddp")
    parts += [name for name in ("tp", "pp") if degrees[name] > 1]
    return "+".join(parts) or "single"
