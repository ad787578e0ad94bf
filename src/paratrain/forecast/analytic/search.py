"""The best layout for a shape at N GPUs on a hardware profile, from the analytic step alone
: every way to cut N GPUs into tensor parallel (within a node), pipeline and data
parallel (FSDP, HSDP sharded within a node, or DDP) at a fixed global batch, each pipeline schedule
and micro-batch count torchtitan offers, each activation-checkpointing mode; the fastest that
fits in memory wins. Pure; seconds for thousands of layouts."""

from __future__ import annotations

from dataclasses import replace

from paratrain.errors import UserError
from paratrain.forecast.analytic.hardware import Hardware
from paratrain.forecast.analytic.step import AC_MODES, Cut, Training, implied_loss, predict
from paratrain.forecast.shapes import Shape


def _powers(limit: int) -> list[int]:
    out, k = [], 1
    while k <= limit:
        out.append(k)
        k *= 2
    return out


def layouts(shape: Shape, hw: Hardware, gpus: int, global_batch: int) -> list[tuple[Cut, int]]:
    """(layout, local batch) for every cut of N GPUs the model and the batch allow."""
    out = []
    for tp in _powers(min(hw.gpus_per_node, gpus)):
        if shape.heads % tp or (shape.kv_heads % tp and tp % shape.kv_heads):
            continue
        for pp in _powers(gpus // tp):
            if gpus % (tp * pp) or pp > shape.layers:
                continue
            dp = gpus // (tp * pp)
            if global_batch % dp:
                continue
            local = global_batch // dp
            replicas = [1]
            inside = hw.gpus_per_node // tp  # HSDP: shard within a node, replicate across
            if 1 < inside < dp and dp % inside == 0:
                replicas.append(dp // inside)
            if dp > 1:  # DDP: every replica whole
                replicas.append(dp)
            for r in replicas:
                base = Cut(gpus, tp=tp, pp=pp, dp_replicate=r, async_tp=tp > 1)
                if pp == 1:
                    out.append((base, local))
                    continue
                for m in sorted({pp, local}):
                    if m < pp or local % m:
                        continue
                    out.append((replace(base, schedule="1f1b", microbatches=m), local))
                    if pp * 2 <= shape.layers:
                        out.append(
                            (
                                replace(
                                    base, schedule="interleaved", stages_per_rank=2, microbatches=m
                                ),
                                local,
                            )
                        )
    return out


def best(
    shape: Shape,
    hw: Hardware,
    gpus: int,
    *,
    seq_len: int = 8192,
    global_batch: int | None = None,
    float8: bool = False,
    compile: bool = True,
    loss: str | None = None,  # None: the compile choice's (implied_loss)
    attention: str | None = None,
) -> dict:
    """The fastest layout that fits, and how many were weighed; global batch default: one
    sequence a GPU."""
    batch = global_batch or gpus
    loss = loss or implied_loss(compile)
    tried, fits = 0, []
    for layout, local in layouts(shape, hw, gpus, batch):
        for ac in AC_MODES:
            train = Training(
                seq_len, local, ac, compile=compile, float8=float8, loss=loss, attention=attention
            )
            p = predict(shape, hw, layout, train)
            tried += 1
            if p["fits"]:
                fits.append((p["tps_per_gpu"], ac, layout, p))
    if not fits:
        state = shape.params * 16 / gpus / 2**30  # fp32 weights, gradients, AdamW's moments
        raise UserError(
            f"plan: no layout fits {gpus} GPUs (the training state alone is {state:,.1f} GiB a "
            f"GPU of {hw.memory_gib:g}) at a global batch of {batch} x {seq_len}"
        )
    tps, ac, layout, p = max(fits, key=lambda x: x[0])
    return {
        "gpus": gpus,
        "layout": layout.describe(),
        "cut": layout,
        "ac": ac,
        "local_batch": batch // layout.dp,
        "global_batch": batch,
        "tps_per_gpu": tps,
        "memory_gib": p["memory_gib"],
        "step_s": p["step_s"],
        "mfu": p["mfu"],
        "weighed": tried,
        "fitting": len(fits),
    }
