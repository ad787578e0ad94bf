"""The speed levers left at `auto`, decided once for this machine and this run.

A lever changes how fast a step runs and not what it computes beyond the step-to-step noise:
torch.compile and its mode and scope, the fused optimizer, bf16 weights with fp32 masters, the
fused loss kernel, LoRA's adapters inside their base matmuls, paratrain's image kernels, channels_last, cudnn.benchmark, and one process
for a run that comes to one rank. Each is `auto` unless the recipe or the command line sets it;
`resolve` asks `decide` here, which writes the concrete value into the config as it runs and
returns a Choice with one short reason for the plan's lines and plan.json. What only one task
knows (which of its models compile with CUDA graphs, which kernels were measured for it) the
task declares itself: `Task.levers(config, layout, machine)`. `levers: plain` gives every lever
left at auto PyTorch's plain setting, as the seed's scripts run.

Levers that change the numerics beyond noise (float8, gradient compression, sync modes, a larger
batch) are never decided here; `hints` names the ones measured faster, for the plan to print.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from paratrain.config.levers import PLAIN, get, put
from paratrain.protocols import Choice, Machine, Task

PLAIN_REASON = "levers=plain: PyTorch's plain setting"

# What DDP or torchrun does that one process does not: a run asking for one keeps both.
NEEDS_DDP = (
    ("launch.max_restarts", lambda c: c.launch.max_restarts > 0, "restarts need torchrun's agent"),
    ("sync.mode", lambda c: c.sync.mode != "every_step", "a sync mode acts on DDP's replicas"),
    (
        "ddp.gradient_compression",
        lambda c: c.ddp.gradient_compression != "none",
        "compression acts on DDP's all-reduce",
    ),
    ("sync.simulated_gbps", lambda c: bool(c.sync.simulated_gbps), "a simulated link delays DDP"),
    ("model.sync_batchnorm", lambda c: c.model.sync_batchnorm, "SyncBatchNorm converts for DDP"),
)


def machine_of(device: str) -> Machine:
    """What the levers see of this process's machine: the first visible GPU's name and compute
    capability, and whether Triton (inductor's and paratrain's kernels) imports. Read through
    NVML, as torch.cuda.device_count does: the launching process (a sweep's too) makes no CUDA
    context, which would hold memory on that GPU for the whole run."""
    if device != "cuda":
        return Machine(device=device)
    try:
        triton = importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        triton = False
    capability, name = gpu_facts()
    return Machine(device="cuda", capability=capability, triton=triton, gpu=name)


def gpu_facts() -> tuple[tuple[int, int], str]:
    import torch

    try:
        handle = torch.cuda._get_pynvml_handler(0)  # CUDA_VISIBLE_DEVICES' first, no context
        nvml = torch.cuda.pynvml
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return (major, minor), str(nvml.nvmlDeviceGetName(handle))
    except Exception:  # noqa: BLE001 - no NVML here: torch's own reading (it makes a context)
        return tuple(torch.cuda.get_device_capability(0)), torch.cuda.get_device_name(0)


def one_process(cfg, strategy: str, world: int) -> tuple[str, Choice | None]:
    """launch.one_process: a ddp-* strategy that comes to one rank runs as `single` (the same
    arithmetic without torchrun's launch and DDP's reducer) -> (strategy, its Choice)."""
    key, asked = "launch.one_process", cfg.launch.one_process
    if world != 1 or not strategy.startswith("ddp"):
        if asked != "auto":
            return strategy, Choice(key, asked, "as set", "set")
        put(cfg, key, False)
        why = f"{world} ranks" if world != 1 else f"{strategy} runs one process already"
        return strategy, Choice(key, False, why, by(cfg))
    needs = [f"{k} ({why})" for k, asks, why in NEEDS_DDP if asks(cfg)]
    if asked is True and needs:
        raise ValueError(f"{key}: true, but {needs[0]}; set it false or drop that setting")
    if asked == "auto":
        if cfg.levers == "plain" or needs:
            why = PLAIN_REASON if cfg.levers == "plain" else f"kept DDP: {needs[0]}"
            put(cfg, key, False)
            return strategy, Choice(key, False, why, by(cfg))
        put(cfg, key, True)
        return "single", Choice(
            key,
            True,
            f"{strategy} on one rank: one process without torchrun or DDP's wrapper "
            "(the same arithmetic; no launcher, no reducer)",
            "auto",
        )
    if asked:
        return "single", Choice(key, True, f"{strategy} on one rank, as set", "set")
    return strategy, Choice(key, False, "as set", "set")


def by(cfg) -> str:
    """Who settled a lever left at auto: the plan (auto) or levers=plain."""
    return "auto" if cfg.levers == "auto" else "plain"


def decide(cfg, task, layout, machine: Machine) -> list[Choice]:
    """Every lever still at auto made concrete in `cfg` (the config as it runs) -> the choices,
    the ones set explicitly among them (they always win)."""
    given = {key: get(cfg, key) for key in PLAIN if key != "launch.one_process"}
    choices: list[Choice] = []

    def settle(key: str, value: Any, reason: str) -> None:
        if get(cfg, key) == "auto":
            put(cfg, key, value)
            choices.append(Choice(key, value, reason, by(cfg)))

    if cfg.levers == "plain":
        for key in given:
            settle(key, PLAIN[key], PLAIN_REASON)
        return choices + explicit(given)
    settle("train.compile", *compile_choice(task, layout, machine))
    for key, (value, reason) in task.levers(cfg, layout, machine).items():
        settle(key, value, reason)
    settle("train.fused_optimizer", *fused_choice(cfg, layout, machine))
    for key in given:  # what neither this module nor the task decided: the plain setting
        settle(key, PLAIN[key], not_here(machine, task))
    return choices + explicit(given)


def unsettled(plan):
    """The plan's config with the levers it decided back at auto: what a run of another layout
    or machine (plan's calibrations, a tune's trials) resolves again for itself."""
    import copy

    cfg = copy.deepcopy(plan.config)
    for choice in plan.levers:
        if choice.by != "set":
            put(cfg, choice.key, "auto")
    return cfg


def as_decided_before(chosen: list[Choice], before, given=()) -> list[Choice]:
    """A resumed run's config.yaml holds the values its first plan decided, so they come back
    as set. Each lever that plan decided (auto or plain; `before`: its plan.json's levers) and
    that holds that value still, not given again, is shown as it was: decided, with its reason;
    what the user set stays set."""
    decided = {c.key: c for c in before if c.by != "set"}
    out = []
    for c in chosen:
        old = decided.get(c.key)
        same = old is not None and c.by == "set" and old.value == c.value and c.key not in given
        out.append(old if same else c)
    return out


def decided_in(plan_json) -> tuple[Choice, ...]:
    """The levers a run folder's plan.json records (none if it has none or does not read)."""
    import json
    from pathlib import Path

    try:
        found = json.loads(Path(plan_json).read_text()).get("levers", ())
        return tuple(Choice(**c) for c in found)
    except (OSError, ValueError, TypeError, AttributeError):
        return ()


def explicit(given: dict[str, Any]) -> list[Choice]:
    return [Choice(k, v, "as set", "set") for k, v in given.items() if v != "auto"]


def not_here(machine: Machine, task) -> str:
    if machine.device != "cuda":
        return f"on the {machine.device}: PyTorch's own setting"
    if not machine.triton:
        return "no Triton in this install: PyTorch's own setting"
    return f"not for task {task.name} here"


def compile_choice(task, layout, machine: Machine) -> tuple[bool, str]:
    if machine.device != "cuda":
        return False, f"on the {machine.device}, compiling costs more than these steps save"
    if not machine.triton:
        return False, "inductor's GPU kernels need Triton, which this install lacks"
    if machine.capability is not None and machine.capability < (7, 0):
        return False, f"inductor's Triton kernels need compute capability 7.0+ (sm {cap(machine)})"
    if not task.compiles:
        return False, f"task {task.name}'s models are compiled only when asked (train.compile)"
    if "pp" in layout.uses:
        return False, "pipeline stages are not compiled yet"
    return True, "a GPU with Triton: inductor fuses the step's elementwise work into few kernels"


def fused_choice(cfg, layout, machine: Machine) -> tuple[bool, str]:
    if machine.device != "cuda":
        return False, f"on the {machine.device}: the foreach optimizer, as measured here"
    if cfg.train.optimizer not in ("sgd", "adamw"):
        return False, f"{cfg.train.optimizer} is torchao's own kernel"
    if cfg.train.optimizer == "sgd" and layout.uses & {"fsdp", "tp"}:
        return False, "fused SGD has no rule for FSDP's and TP's sharded (DTensor) weights"
    if cfg.train.bf16_weights is True:
        return False, "bf16_weights updates with MasterAdamW's own kernel"
    return True, (
        "one kernel a parameter group, the same update; the NaN guard's verdict stays on the GPU"
    )


def cap(machine: Machine) -> str:
    return ".".join(map(str, machine.capability or ()))


def hints(cfg, task: Task, machine: Machine) -> list[str]:
    """Faster here, but other numerics: named with the measured factor, never switched on."""
    if machine.device != "cuda" or (machine.capability or (0, 0)) < (8, 9):
        return []
    if not task.fp8 or cfg.model.fp8 != "none" or cfg.precision != "bf16":
        return []
    from paratrain.tasks.lm_levers import family

    if not family(cfg).levers_measured:  # measured on the Llama shapes
        return []
    if cfg.lora.enabled:
        return [
            "model.fp8=delayed: float8 base layers (and lm_head) ran LoRA 1.48x this bf16 "
            "set-up on one H200 (2.01x transformers + peft; losses 0.13% apart); opt-in, it "
            "changes the numerics (benchmarks/results/2026-12-04-h200x1/issue34/, call 59)"
        ]
    return [
        "model.fp8=delayed: float8 matmuls (and lm_head) ran full training 1.15x torchtitan's "
        "float8 on one H200 (losses 0.12% from torchtitan's); opt-in, it changes the numerics "
        "(benchmarks/results/2026-12-03-h200x1/issue34/)"
    ]
