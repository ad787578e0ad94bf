"""`paratrain tune`'s search space: levers, each a config key (or a few keys set together) and
its values, in the order the search tries them (the ones that usually matter most first).

The default space is built from the recipe and the machine: GPU-only levers (resize on the GPU,
side-stream prefetch, CUDA graphs, fp8) only with a GPU, model-family levers only where the
family has them, the strategy and process count only with several devices. A space file
replaces it:

```yaml
levers:
  - {key: precision, values: [fp32, bf16]}
  - {key: compile, values: [off, default, reduce-overhead]}   # a named lever, see COMPOUND
  - {key: data.batch_size, values: [32, 64]}
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from paratrain.bench.sweep import yaml_scalar
from paratrain.config import RunConfig, read_yaml
from paratrain.config.levers import get
from paratrain.errors import ConfigError
from paratrain.tasks import get_task

# levers that set several keys at once: value -> overrides
COMPOUND: dict[str, dict[Any, list[str]]] = {
    "compile": {
        "off": ["train.compile=false"],
        "default": ["train.compile=true", "train.compile_mode=default"],
        "reduce-overhead": ["train.compile=true", "train.compile_mode=reduce-overhead"],
        "max-autotune-no-cudagraphs": [
            "train.compile=true",
            "train.compile_mode=max-autotune-no-cudagraphs",
        ],
    },
    # DDP without its per-step gradient copies, bookkeeping and BatchNorm buffer broadcast (the
    # statistics are averaged before evaluations and checkpoints instead)
    "ddp_lean": {
        "off": [],
        "on": [
            "ddp.gradient_as_bucket_view=true",
            "ddp.static_graph=true",
            "ddp.broadcast_buffers=false",
        ],
    },
}


@dataclass
class Lever:
    key: str
    values: list[Any]
    why: str = ""
    """One line: what the lever does (the tuned recipe's comment)."""

    def overrides(self, value: Any) -> list[str]:
        if self.key in COMPOUND:
            return list(COMPOUND[self.key][value])
        return [f"{self.key}={yaml_scalar(value)}"]


@dataclass
class Space:
    levers: list[Lever] = field(default_factory=list)

    def names(self) -> list[str]:
        return [lever.key for lever in self.levers]


def current(cfg: RunConfig, key: str) -> Any:
    """The recipe's value of a lever."""
    if key == "compile":
        return cfg.train.compile_mode if cfg.train.compile else "off"
    if key == "ddp_lean":
        d = cfg.ddp
        lean = d.gradient_as_bucket_view and d.static_graph and not d.broadcast_buffers
        return "on" if lean else "off"
    return get(cfg, key)


def _lever(cfg: RunConfig, key: str, values: list[Any], why: str) -> Lever | None:
    """A lever whose values start with the recipe's own (the baseline), duplicates dropped;
    None when it leaves a single value."""
    here = current(cfg, key)
    ordered = [here]
    for v in values:
        if v not in ordered:
            ordered.append(v)
    return Lever(key, ordered, why) if len(ordered) > 1 else None


Candidate = tuple[str, list[Any], str]
"""(key, values to try beside the recipe's, why): the recipe's value as the plan settles it
(the auto choice, on this machine) comes first, so a tune measures its gain over auto; the
plain value is among the others, so auto's choice is measured against it too."""


def _input_candidates(on_gpu: bool, image: bool) -> list[Candidate]:
    """How the batch reaches the step and in which precision it is computed."""
    candidates: list[Candidate] = []
    if image and on_gpu:
        candidates.append(("data.resize_on", ["gpu"], "resize on the GPU: small images cross PCIe"))
    if on_gpu:
        candidates.append(
            ("data.prefetch_to_device", [True], "copy the next batch on a side stream")
        )
        candidates.append(("precision", ["bf16", "fp16"], "autocast precision"))
    else:
        candidates.append(("precision", ["fp32", "bf16"], "autocast precision"))
    if image:
        candidates.append(("train.channels_last", [True, False], "NHWC tensors for convolutions"))
    return candidates


def _compile_candidates(cfg: RunConfig, on_gpu: bool, image: bool) -> list[Candidate]:
    """torch.compile, and on a GPU the kernel choices that go with it."""
    if not on_gpu:
        return [("compile", ["default"], "torch.compile")]
    candidates: list[Candidate] = [
        (
            "compile",
            ["default", "reduce-overhead"],
            "torch.compile; reduce-overhead adds CUDA graphs",
        )
    ]
    if image and cfg.model.name == "mobilenet_v2":
        candidates.append(
            (
                "model.depthwise_conv",
                ["shift-add", "triton", "native"],
                "depthwise convolutions as compiled shift-adds or paratrain's Triton kernels",
            )
        )
        # after depthwise_conv: with it native this lever's trial is refused (invalid), and a
        # model without a one-channel stem (RGB input) refuses it too
        candidates.append(
            (
                "model.stem_conv",
                ["depthwise", "native"],
                "a one-channel stem in the depthwise form (1.04x on one H200: benchmarks/results/2026-12-03-h200x1/issue34/)",
            )
        )
    if image and not cfg.model.sync_batchnorm:
        candidates.append(
            (
                "model.batchnorm",
                ["triton", "native"],
                "BatchNorm + ReLU6 as paratrain's Triton kernels over channels_last tensors",
            )
        )
    if image:
        candidates.append(
            ("train.cudnn_benchmark", [True, False], "cuDNN picks its fastest kernels")
        )
    if cfg.train.optimizer == "adamw":  # fused SGD has no DTensor rule under tensor parallelism
        # 8B LoRA on one H200 (profiled in benchmarks/results/2026-12-04-h200x1/issue34/): with foreach AdamW the NaN guard read its
        # flag on the host, and the host waited 47 ms a step with the GPU queue drained
        candidates.append(
            (
                "train.fused_optimizer",
                [True, False],
                "the optimizer in one kernel; the NaN guard's verdict stays on the device",
            )
        )
    return candidates


def _lm_candidates(cfg: RunConfig, on_gpu: bool) -> list[Candidate]:
    """A language model's levers: its layers' kernels on a GPU, its loss and its memory."""
    candidates: list[Candidate] = []
    full_bf16 = not cfg.lora.enabled and cfg.precision == "bf16" and cfg.train.optimizer == "adamw"
    one_or_ddp = cfg.strategy in ("single", "auto") or cfg.strategy.startswith("ddp-")
    if on_gpu and full_bf16 and one_or_ddp:
        # one H200, the 1B shape (benchmarks/results/2026-12-04-h200x1/issue34/): 1.08-1.09x torchtitan against 1.03-1.05x; under
        # DDP the gradients are summed in fp32 (measured on one GPU only)
        candidates.append(
            (
                "train.bf16_weights",
                [True, False],
                "bf16 weights, their fp32 masters in AdamW: no per-matmul weight casts",
            )
        )
    if on_gpu and cfg.strategy in ("single", "auto"):
        # one H200, the 1B shape, with bf16 weights and the Triton loss (benchmarks/results/2026-12-04-h200x1/issue34/): 1.098-1.104x
        # torchtitan against 1.094-1.097x per layer; refused (an invalid trial) without compile
        candidates.append(
            (
                "train.compile_scope",
                ["decoder", "blocks"],
                "the whole decoder as one compiled graph: fusions across layer boundaries",
            )
        )
    if on_gpu:
        candidates.append(
            (
                "model.fp8",
                ["rowwise", "tensorwise", "delayed"],
                "float8 linear layers (torchao; delayed: scales from each cast's amax history)",
            )
        )
        candidates.append(
            (
                "model.kernels",
                ["liger-loss", "liger", "triton-loss", "none"],
                "Liger's fused cross-entropy (liger-loss) or all its kernels (liger), or "
                "paratrain's Triton loss (its gradient written in forward)",
            )
        )
    candidates.append(
        (
            "model.loss_chunk_tokens",
            [1024],
            "the loss 1,024 tokens at a time: the whole logits never exist",
        )
    )
    candidates.append(
        ("train.activation_checkpointing", [True], "recompute activations: less memory")
    )
    return candidates


def _parallel_candidates(cfg: RunConfig, gpus: int, on_gpu: bool) -> list[Candidate]:
    """How the devices share the work: DDP's own costs, the strategy, the gradients' dtype."""
    candidates: list[Candidate] = []
    ddp = cfg.strategy.startswith("ddp")
    if ddp and on_gpu:
        candidates.append(("ddp_lean", ["on"], "DDP without per-step copies and buffer broadcast"))
    if gpus > 1:
        candidates.append(("strategy", ["ddp-ds", "fsdp"], "how the GPUs share the work"))
        candidates.append(("ddp.gradient_compression", ["bf16"], "all-reduce gradients in bf16"))
    elif ddp and on_gpu:
        candidates.append(("strategy", ["single"], "one GPU: no DDP wrapper at all"))
    return candidates


def _data_candidates(cfg: RunConfig, on_gpu: bool, image: bool) -> list[Candidate]:
    """The batch size, then the image loader's processes."""
    candidates: list[Candidate] = [
        ("data.batch_size", [cfg.data.batch_size * 2], "per-GPU batch (changes what is learned)")
    ]
    if image:
        workers = cfg.data.num_workers
        # on a GPU the step outruns loader processes: more of them, never none
        fewer = [] if on_gpu else [0 if workers else 2]
        candidates.append(("data.num_workers", [max(2, workers * 2), *fewer], "loader processes"))
    return candidates


def default_space(cfg: RunConfig, gpus: int) -> Space:
    """The levers worth trying for this recipe on this machine (`gpus`: 0 on the CPU)."""
    on_gpu = gpus > 0 and cfg.device != "cpu"
    task = get_task(cfg.task)
    image, lm = task.image_levers, task.decoder_levers
    candidates = [
        *_input_candidates(on_gpu, image),
        *_compile_candidates(cfg, on_gpu, image),
        *(_lm_candidates(cfg, on_gpu) if lm else []),
        *_parallel_candidates(cfg, gpus, on_gpu),
        *_data_candidates(cfg, on_gpu, image),
    ]
    levers = [lv for k, v, why in candidates if (lv := _lever(cfg, k, v, why)) is not None]
    return Space(levers)


def read_space(path: str, cfg: RunConfig) -> Space:
    spec = read_yaml(path)
    items = spec.get("levers") if isinstance(spec, dict) else None
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path}: expected levers: [{{key: ..., values: [...]}}, ...]")
    levers = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) - {"key", "values", "why"} or "key" not in item:
            raise ConfigError(f"{path}: levers[{i}]: expected {{key, values, why}}, got {item!r}")
        key, values = str(item["key"]), item.get("values")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: levers[{i}].values: expected a list, got {values!r}")
        if key in COMPOUND:  # YAML reads a bare off / on as false / true
            on = "default" if key == "compile" else "on"
            values = [{False: "off", True: on}.get(v, v) for v in values]
        if key in COMPOUND and set(values) - set(COMPOUND[key]):
            raise ConfigError(
                f"{path}: levers[{i}]: {key} takes {', '.join(COMPOUND[key])}, got {values}"
            )
        lever = _lever(cfg, key, values, str(item.get("why", "")))
        if lever:
            levers.append(lever)
    return Space(levers)


def keep(space: Space, keys: list[str]) -> Space:
    """--keep KEY: hold these levers at the recipe's value (not searched)."""
    unknown = [k for k in keys if k not in space.names()]
    if unknown:
        raise ConfigError(
            f"--keep: {unknown[0]} is not a lever of this search; levers: {', '.join(space.names())}"
        )
    return Space([lv for lv in space.levers if lv.key not in keys])
