"""`paratrain plan` without a recipe or a GPU: `--validate torchtitan-h100` prints the
published table beside the analytic prediction; `--hardware PROFILE --shape NAME --gpus
8,64,512` prints the best layout at each scale with its predicted TPS/GPU and memory."""

from __future__ import annotations

from paratrain.errors import UserError
from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware, search, validate


def run_validate(suite: str, profile: str | None, terms: bool) -> int:
    if suite not in validate.SUITES:
        raise UserError(f"--validate: unknown {suite!r}; choose from {', '.join(validate.SUITES)}")
    found = validate.run(suite, profile or "h100-hbm2e-500w")
    print(validate.table(found, terms=terms))
    return 0


def run_layouts(
    profile: str,
    shape_name: str,
    gpus: list[int],
    *,
    seq_len: int,
    global_batch: int | None,
    float8: bool,
) -> int:
    hw = hardware.load(profile)
    shape = shapes.shape(shape_name)
    if float8 and not hw.fp8_tflops:
        raise UserError(f"--float8: {hw.name} has no float8 matmuls")
    print(
        f"paratrain plan: {shape.name} ({shape.params / 1e9:,.1f}B parameters) on {hw.name} "
        f"({hw.description}); sequence {seq_len}, "
        f"{'bf16 + float8 linears' if float8 else 'bf16'}, compiled; predicted from the "
        "profile, no GPU"
    )
    header = "| GPUs | best layout | AC | local batch | TPS/GPU | memory GiB | step s | MFU |"
    print(header)
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for n in gpus:
        try:
            b = search.best(shape, hw, n, seq_len=seq_len, global_batch=global_batch, float8=float8)
        except UserError as e:
            print(f"| {n} | {str(e).removeprefix('plan: ')} | | | | | | |")
            continue
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
    print(f"  hardware derates and their sources: {hw.path}")
    return 0
