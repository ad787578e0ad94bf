"""`paratrain plan` without a recipe or a GPU: `--validate torchtitan-h100` prints the
published table beside the analytic prediction; `--hardware PROFILE --shape NAME --gpus
8,64,512` prints the best layout at each scale with its predicted TPS/GPU and memory;
with `--layout` the one layout the user names, each term of its step, or `--json`."""

from __future__ import annotations

import json

from paratrain.errors import UserError
from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware, search, validate
from paratrain.forecast.analytic.step import Training, implied_loss, parse_cut, predict


def run_validate(suite: str, profile: str | None, terms: bool, as_json: bool = False) -> int:
    found = validate.run(suite, profile)
    print(json.dumps(found) if as_json else validate.table(found, terms=terms))
    return 0


def run_layouts(
    profile: str,
    shape_name: str,
    gpus: list[int],
    *,
    seq_len: int,
    global_batch: int | None,
    float8: bool,
    compile: bool = True,
    loss: str | None = None,  # None: the compile choice's
    attention: str | None = None,
) -> int:
    hw = hardware.load(profile)
    loss = loss or implied_loss(compile)
    shape = shapes.shape(shape_name)
    if float8 and not hw.fp8_tflops:
        raise UserError(f"--float8: {hw.name} has no float8 matmuls")
    print(
        f"paratrain plan: {shape.name} ({shape.params / 1e9:,.1f}B parameters) on {hw.name} "
        f"({hw.description}); sequence {seq_len}, "
        f"{'bf16 + float8 linears' if float8 else 'bf16'}, {'compiled' if compile else 'eager'}"
        f", the loss {loss}; predicted from the profile, no GPU"
    )
    header = "| GPUs | best layout | AC | local batch | TPS/GPU | memory GiB | step s | MFU |"
    print(header)
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    named = None  # the largest scale's best, as the flags that price it again
    for n in gpus:
        try:
            b = search.best(
                shape, hw, n, seq_len=seq_len, global_batch=global_batch, float8=float8,
                compile=compile, loss=loss, attention=attention,
            )  # fmt: skip
        except UserError as e:
            print(f"| {n} | {str(e).removeprefix('plan: ')} | | | | | | |")
            continue

        train = Training(seq_len, b["local_batch"], b["ac"], compile=compile, float8=float8,
                         loss=loss, attention=attention)  # fmt: skip
        named = f"--gpus {n} --layout {b['cut'].as_flag()} --local-batch {b['local_batch']} "
        named += f"--ac {b['ac']} "
        named += " ".join(train.as_flags())
        mfu = f"{b['mfu']:.0%}" if b["mfu"] else "-"
        print(
            f"| {n} | {b['layout']} | {b['ac']} | {b['local_batch']} | {b['tps_per_gpu']:,.0f} "
            f"| {b['memory_gib']:.1f} | {b['step_s']:.2f} | {mfu} |"
        )
    print(
        f"  global batch: {'one sequence a GPU' if global_batch is None else f'{global_batch} sequences'}"
        f"; {hw.memory_gib:g} GiB a GPU; each scale weighs every TP (within a node) x PP x "
        "FSDP / HSDP / DDP cut, pipeline schedule, micro-batch count and AC mode"
    )
    if hw.power_w < hw.rated_power_w:
        print(
            f"  at {hw.power_w:g} W of {hw.rated_power_w:g}: the compute rates x {hw.clock:.3f}, "
            f"the clock a power curve of {hw.static_w:g} W static and exponent "
            f"{hw.power_exponent:g} allows (sources.power in the profile says where it is from)"
        )
    if named:
        print(f"  to price it again, or a variation of it: {named} (with --json: each term)")
    print(f"  hardware derates and their sources: {hw.path}")
    return 0


def assumptions(train: Training, hw) -> list[str]:
    """What framework behaviour the prediction takes for granted, one phrase each: the numbers
    move when a run does otherwise."""
    said = [
        "torch.compile over each layer" if train.compile else "eager",
        "torchtitan's pipeline schedules and FSDP2 (weights, gradients, AdamW's moments in fp32)",
        {
            "eager": "the loss over fp32 logits, eager (torchtitan 2024's)",
            "compiled": "the loss compiled over bf16 logits (torchtitan's since 2025-04)",
            "fused": "a fused loss (the gradient written in its forward)",
        }[train.loss],
        "foreach AdamW" if not train.fused_optimizer else "fused AdamW",
        "live tensors only: the caching allocator's reserve is not counted",
    ]
    if train.float8:
        said.append(
            "float8 tensorwise linears (torchao), lm_head in bf16, "
            + ("float8 all-gather of the weights" if train.fp8_gather else "bf16 all-gather")
        )
    if hw.rates is None:
        said.append("every GEMM and attention at the profile's derated rates (no rates table: "
                    "--attention does not apply)")  # fmt: skip
    else:
        said.append(
            f"each GEMM and {train.attention or hw.attention_backend} attention at its measured rate ({hw.rates.path.rsplit('/', 1)[-1]})"
        )
    return said


def run_layout(
    profile: str,
    shape_name: str,
    gpus: int,
    layout: str,
    *,
    ac: str,
    local_batch: int,
    seq_len: int,
    float8: bool,
    as_json: bool,
    compile: bool = True,
    loss: str | None = None,  # None: the compile choice's
    attention: str | None = None,
) -> int:
    """The layout a user names, priced term by term: a table, or one JSON object."""
    hw = hardware.load(profile)
    shape = shapes.shape(shape_name)
    if float8 and not hw.fp8_tflops:
        raise UserError(f"--float8: {hw.name} has no float8 matmuls")
    cut = parse_cut(layout, gpus)
    loss = loss or implied_loss(compile)
    train = Training(
        seq_len, local_batch, ac, compile=compile, float8=float8, loss=loss, attention=attention
    )
    p = predict(shape, hw, cut, train)
    found = {
        "shape": shape.name,
        "parameters": shape.params,
        "hardware": hw.name,
        "gpus": gpus,
        "layout": p["layout"],
        "ac": ac,
        "local_batch": local_batch,
        "global_batch": local_batch * cut.dp,
        "seq_len": seq_len,
        "float8": float8,
        "compile": compile,
        "loss": loss,
        "tps_per_gpu": p["tps_per_gpu"],
        "step_s": p["step_s"],
        "memory_gib": p["memory_gib"],
        "fits": p["fits"],
        "usable_gib": hw.usable_bytes / 2**30,
        "mfu": p["mfu"] or None,
        "terms": p["terms"],
        "tp_comm_s": p["tp_comm_s"],
        "fsdp_comm_s": p["fsdp_comm_s"],
        "memory": {k: v for k, v in p["memory"].items() if isinstance(v, (int, float))},
        "assumes": assumptions(train, hw),
    }
    if as_json:
        print(json.dumps(found))
        return 0
    fits = "fits" if p["fits"] else f"does NOT fit ({found['usable_gib']:.1f} GiB usable)"
    print(
        f"paratrain plan: {shape.name} ({shape.params / 1e9:,.1f}B) on {gpus} x {hw.name}: "
        f"{p['layout']}, AC {ac}, local batch {local_batch} x {seq_len} "
        f"({'bf16 + float8 linears' if float8 else 'bf16'}, {'compiled' if compile else 'eager'}"
        f", the loss {loss}; from the profile, no GPU)"
    )
    mfu = f", MFU {p['mfu']:.0%}" if p["mfu"] else ""
    print(
        f"  {p['tps_per_gpu']:,.0f} tokens/s a GPU, step {p['step_s']:.3f} s{mfu}; "
        f"memory {p['memory_gib']:.1f} GiB: {fits}"
    )
    print("  step terms (s): " + ", ".join(f"{k[:-2]} {v:.3f}" for k, v in p["terms"].items() if v))
    print("  assumes: " + "; ".join(found["assumes"]))
    print(f"  hardware derates and their sources: {hw.path}")
    return 0
