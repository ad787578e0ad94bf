"""What a run on the CPU hears before step 1, from measurements rather than hopes: how much
longer a training step takes there in fp16 or bf16 than in fp32 (measured on paratrain's
models; the factors and their source below), and the memory the run expects a process against
what this machine has (refused in one line only where it clearly cannot fit, else a note).

The memory a process expects, as counted here: the weights, gradients and optimizer state of
the model's parameters (sharded ones divided over their ranks; DDP's gradient buckets), the
activations autograd keeps for backward (the task's footprint: one sample's saved tensors
counted without data, times data.batch_size), the loader's batches in flight, and the process
itself (PyTorch and paratrain: PROCESS). Not counted: the loader's worker processes, the
backward's gradient buffers and the allocator's slack, and under fp16 or bf16 autocast the half
copies it keeps beside the fp32 ones (models/footprint.py). So the figure is a floor: a run
above the machine's memory cannot fit, and one near it may not. (MobileNetV2 at 64x64, batch
64, two processes: 457 MiB a process expected before the process itself was counted, 1,077 MiB
peak resident measured a rank in fp32, 737 in fp16; SOURCE's end_to_end.txt.)
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from paratrain.errors import UserError

SOURCE = "benchmarks/results/2026-12-07-cpu/precision_speed/"
MEASURED_ON = "an AMD EPYC (Zen 4, avx512_bf16, 1 thread)"
# A training step (forward, backward, AdamW; fp16 with its GradScaler) under fp16 or bf16
# autocast, over the same step in fp32: the CPU time of one thread, the mean of two runs' medians
# of benchmarks/cpu/precision_speed.py (SOURCE: threads1_a.json, threads1_b.json).
SLOWER = {
    "mobilenet_v2": ("MobileNetV2 at 64x64", {"fp16": 7.8, "bf16": 0.9}),
    "tiny_cnn": ("the tiny CNN at 28x28", {"fp16": 4.6, "bf16": 1.0}),
    "language": ("the tiny Llama at 128 tokens", {"fp16": 6.8, "bf16": 1.6}),
}
IMAGE = ("mobilenet_v2", "tiny_cnn")
SLOW = 1.5  # a factor below it is not worth a line: noise on a shared machine is about 1.2x

# A process before its model and data: PyTorch and paratrain imported, resident (a rank of the
# tiny CNN's run peaked at 488 MiB, of the tiny Llama's at 643 MiB: SOURCE's end_to_end.txt)
PROCESS = 0.5 * 2**30

# Bytes of optimizer state per trainable parameter of 4 bytes (twice for fp64's 8)
OPTIMIZER_STATE = {"adamw": 2.0, "sgd": 1.0, "adamw8bit": 0.5, "adamw4bit": 0.25, "adamw-fp8": 0.5}


def half_precision_notes(cfg, task, device: str) -> list[str]:
    """fp16 / bf16 on the CPU, where measured slower than fp32 for this kind of model: the
    factor and where it was measured."""
    precision = cfg.precision
    if device != "cpu" or precision not in ("fp16", "bf16"):
        return []
    measured = [SLOWER[k] for k in kinds(cfg, task)]
    factors = sorted(f[precision] for _, f in measured)
    if factors[-1] < SLOW:
        return []
    if len(measured) == 1:
        what = f"a training step of {measured[0][0]} took {factors[0]:.1f}x"
    else:
        names = [name for name, _ in measured]
        names = f"{', '.join(names[:-1])} and {names[-1]}"
        what = f"training steps of {names} took {factors[0]:.1f}-{factors[-1]:.1f}x"
    return [
        f"precision {precision} on the cpu: {what} as long as in fp32 on {MEASURED_ON} "
        f"({SOURCE}); fp32 is the fast precision on a CPU"
    ]


def kinds(cfg, task) -> tuple[str, ...]:
    """The measured models nearest this run's: its own (a task that builds model.name, with
    the image levers), or those of its kind."""
    if task.model_keys == "builder":
        own = task.image_levers and cfg.model.name in IMAGE
        return (cfg.model.name,) if own else IMAGE
    if task.model_keys == "huggingface":
        return ("language",)
    return tuple(SLOWER)


def expected(plan) -> dict[str, float] | None:
    """The bytes one process of this run expects, by what holds them; None where the task
    gives no footprint."""
    cfg, task = plan.config, plan.task_spec
    try:
        model = task.footprint(cfg) if task.footprint else None
    except Exception:  # noqa: BLE001 - an estimate that cannot be made is left out, not fatal
        model = None
    if model is None:
        return None
    wide = 8 if cfg.precision == "fp64" else 4
    trainable = model["trainable"]
    frozen = model["parameters"] - trainable
    # LoRA's frozen base lives in the autocast dtype (tasks/causal_lm.py)
    frozen_bytes = 2 if cfg.precision in ("fp16", "bf16") and task.lora else wide
    per_trained = wide * (2 + optimizer_state(cfg))  # weight, gradient, optimizer state
    if plan.layout.wrapper == "ddp" and not cfg.ddp.gradient_as_bucket_view:
        per_trained += wide  # DDP's buckets: a copy of the gradients
    deg = plan.layout.degrees
    model_split = deg["tp"] * deg["pp"]
    d = cfg.data
    in_flight = (d.num_workers * (d.prefetch_factor or 2) if d.num_workers else 1) + 1
    return {
        "state": (trainable * per_trained + frozen * frozen_bytes)
        / (deg["dp_shard"] * model_split),
        "activations": d.batch_size * model["saved_per_sample"] / model_split,
        "per_sample": model["saved_per_sample"],
        "loader": in_flight * d.batch_size * model["input_per_sample"],
    }


def optimizer_state(cfg) -> float:
    if cfg.train.optimizer == "sgd" and not cfg.train.momentum:
        return 0.0
    return OPTIMIZER_STATE.get(cfg.train.optimizer, 2.0)


def machine_memory() -> tuple[int, int | None, str] | None:
    """(the bytes this process may use: the machine's or its cgroup's limit, the bytes free
    now, what the limit is) from /proc/meminfo and the cgroup (psutil elsewhere); None where
    neither reads."""
    info = meminfo()
    if info is None:
        return None
    total, free = info
    limit = cgroup_limit()
    if limit is not None and limit[0] < total:
        used = limit[1]
        room = limit[0] - used if used is not None else None
        return limit[0], min(free, room) if room is not None else free, "its cgroup's limit"
    return total, free, "this machine's memory"


def meminfo() -> tuple[int, int] | None:
    try:
        fields = {}
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields[name] = int(value.split()[0]) * 1024
        return fields["MemTotal"], fields.get("MemAvailable", fields.get("MemFree", 0))
    except (OSError, ValueError, KeyError, IndexError):
        pass
    try:
        import psutil
    except ImportError:
        return None
    vm = psutil.virtual_memory()
    return vm.total, vm.available


def cgroup_limit(root: Path = Path("/sys/fs/cgroup")) -> tuple[int, int | None] | None:
    """(the memory limit of this process's cgroup, its usage now), or None where none is set:
    cgroup v2's memory.max (the group's and its parents'), else v1's limit_in_bytes."""
    try:
        line = next(
            x for x in Path("/proc/self/cgroup").read_text().splitlines() if x.startswith("0::")
        )
        group = root / line[3:].strip().lstrip("/")
    except (OSError, StopIteration):
        group = None
    found = []
    while group is not None and root in (group, *group.parents):
        value = read_int(group / "memory.max")
        if value is not None:
            found.append((value, read_int(group / "memory.current")))
        group = group.parent if group != root else None
    if not found:
        value = read_int(root / "memory" / "memory.limit_in_bytes")
        if value is not None and value < 2**60:  # v1 says "no limit" with a huge number
            found.append((value, read_int(root / "memory" / "memory.usage_in_bytes")))
    return min(found) if found else None


def read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def size(n: float) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    if n >= 10 * 2**20:
        return f"{n / 2**20:.0f} MiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def memory_line(plan, need: dict[str, float], machine) -> tuple[str, bool]:
    """-> (the line, whether it clearly cannot fit)."""
    cfg = plan.config
    per = need["state"] + need["activations"] + need["loader"] + PROCESS
    text = (
        f"memory: about {size(per)} a process expected (activations {size(need['activations'])}"
        f" = {cfg.data.batch_size} samples x {size(need['per_sample'])}; weights, gradients and "
        f"{cfg.train.optimizer}'s state {size(need['state'])}; loader batches "
        f"{size(need['loader'])}; the process itself about {size(PROCESS)})"
    )
    total = per * plan.nproc
    if plan.nproc > 1:
        text += f" x{plan.nproc} processes = {size(total)}"
    if machine is None:
        return text, False
    limit, free, what = machine
    if total > limit:
        fixes = ["data.batch_size"] + (["data.image_size"] if plan.task_spec.image_levers else [])
        fewer = ", or run fewer processes (--nproc)" if plan.nproc > 1 else ""
        return f"{text}, more than {what} ({size(limit)}): lower {' or '.join(fixes)}{fewer}", True
    if free is not None and total > free:
        return f"{text}: may not fit, {size(free)} free of {what} ({size(limit)})", False
    return f"{text}, of {what} {size(limit)} ({size(free or 0)} free)", False


def judged(plan):
    """A CPU run's plan with its memory note; refused in one line (UserError) where it
    clearly cannot fit. A GPU run's as it is: its host memory is not what runs out. A plan
    noted already is as it was. Counting the model imports what training imports (torch's
    compiler for the fake tensors, a language model's transformers and peft: 1-3.5 s in a fresh
    process), so the command judges a run of one process, which trains in it, and a launch's
    workers, which import those anyway, judge theirs (worker.py): refused there in one line
    before the model is built, no run folder made."""
    if plan.device != "cpu" or any(n.startswith("memory:") for n in plan.notes):
        return plan
    need = expected(plan)
    if need is None:
        return plan
    line, refused = memory_line(plan, need, machine_memory())
    if refused:
        raise UserError(line)
    return dataclasses.replace(plan, notes=(*plan.notes, line))
