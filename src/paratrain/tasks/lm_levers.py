"""The automatic levers a causal language model knows best (Task.levers; runplan/levers.py asks
after train.compile is decided). Each combination here is one that was measured together:

- full training in bf16 (every weight trained): bf16 weights with fp32 masters in AdamW,
  paratrain's Triton loss (the gradient written in forward) and, in one process, one compiled
  graph over the whole decoder: 1.10x torchtitan on one H200 in seven runs on three machines;
- LoRA on fixed-length rows (synthetic text, packed rows): CUDA graphs over the compiled layers,
  1.36-1.37x transformers + peft on one H200, 1.43x peft with compile on an H100;
- LoRA on plain Linear bases (bf16 / fp32, no dropout): each adapter's product inside its base
  matmul (lora.fused), 1.013-1.017x peft's own layers with the rest as shipped on one H100;
- with float8 asked (model.fp8, the opt-in): lm_head in float8 too, as measured in both.
"""

from __future__ import annotations

import json
from pathlib import Path

from paratrain.models.causal_lm.build import SHAPES
from paratrain.models.causal_lm.family import Family, family_named, family_of
from paratrain.protocols import Layout, Machine

RESULTS = "benchmarks/results/2026-12-04-h200x1/issue34/"  # full: calls 44-61; LoRA: 40-43, 58-59
# lora.fused as shipped against peft's layers: 1.013x at batch 2, 1.017x at 8, 1.0 / 4.0 GiB less
LORA_FUSED = "benchmarks/results/2026-12-07-h100x1/lora_fused/"


def levers(cfg, layout: Layout, machine: Machine) -> dict[str, tuple[object, str]]:
    if not machine.kernels:
        return {}
    out = {"model.fp8_lm_head": fp8_head(cfg, layout)}
    kind = family(cfg)
    if not kind.levers_measured:  # what follows was measured on the Llama shapes only
        out["train.compile_mode"] = ("default", f"CUDA graphs measured on Llama, not {kind.family}")
        return out
    if cfg.lora.enabled:
        out["train.compile_mode"] = lora_graphs(cfg, layout)
        out["lora.fused"] = lora_fused(cfg, layout, kind)
        return out
    out["lora.fused"] = (False, "no adapters: every weight is trained")
    why = full_bf16(cfg, layout)
    out["train.bf16_weights"] = (
        (False, why)
        if why
        else (
            True,
            f"bf16 weights, fp32 masters in AdamW's state: no casts per matmul, one kernel a "
            f"weight's update (1.09x fp32 weights; {RESULTS})",
        )
    )
    out["model.kernels"] = (
        ("none", why)
        if why
        else (
            "triton-loss",
            "the loss's gradient written in its forward over the logits, no second pass",
        )
    )
    if not why and layout.uses == {"single"} and cfg.train.compile is True:
        out["train.compile_scope"] = (
            "decoder",
            f"one graph over the decoder: a layer's residual add fused into the next norm "
            f"(1.10x torchtitan with the two above, 60% MFU on one H200; {RESULTS})",
        )
    return out


def family(cfg) -> Family:
    """The model's family record without importing transformers: a named shape's, or the one
    model_type names in the checkpoint's config.json."""
    if cfg.model.path is None:
        shape = SHAPES.get(cfg.model.shape)
        return family_of(shape) if shape else family_named(str(cfg.model.shape))
    return family_named(str(checkpoint_config(cfg).get("model_type", "unknown")))


def quantized(cfg) -> bool:
    """model.path's config.json declares a quantization (bitsandbytes, GPTQ, AWQ, ...)."""
    return bool(checkpoint_config(cfg).get("quantization_config"))


def checkpoint_config(cfg) -> dict:
    """model.path's config.json, or {} (no path, no such file, not a JSON object)."""
    if cfg.model.path is None:
        return {}
    try:
        found = json.loads((Path(cfg.model.path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def full_bf16(cfg, layout: Layout) -> str | None:
    """Why full training's bf16 levers do not apply here (None: they do)."""
    if cfg.precision != "bf16":
        return f"measured in bf16, not {cfg.precision}"
    if cfg.model.fp8 != "none":
        return f"float8 layers cast fp32 weights themselves (model.fp8={cfg.model.fp8})"
    if cfg.train.optimizer != "adamw":
        return f"the fp32 masters live in paratrain's AdamW, not {cfg.train.optimizer}"
    if cfg.model.loss_chunk_tokens or cfg.model.fp8_lm_head is True:
        return "the chunked or float8 lm_head's loss computes the logits itself"
    if cfg.model.kernels not in ("auto", "none", "triton-loss"):
        return f"model.kernels={cfg.model.kernels} is set"
    if not layout.uses <= {"single", "ddp"}:
        return f"measured in one process and under DDP, not {', '.join(sorted(layout.uses))}"
    if cfg.sync.mode != "every_step" or cfg.ddp.gradient_compression not in ("none", "bf16"):
        return "sync modes and compressions other than bf16 are not covered"
    return None


def lora_graphs(cfg, layout: Layout) -> tuple[str, str]:
    t, d = cfg.train, cfg.data
    if t.compile is not True:
        return "default", "CUDA graphs replay a compiled step"
    if not (d.packing or d.source == "synthetic-text"):
        return "default", "rows of differing lengths would record a CUDA graph for each shape"
    if t.grad_accum_steps != 1 or t.activation_checkpointing:
        return "default", "CUDA graphs need one micro-batch a step and no recompute"
    if not layout.uses <= {"single", "ddp"}:
        return "default", "measured in one process and under DDP only"
    return "reduce-overhead", (
        f"every row one length: CUDA graphs replay each layer's kernels without launching "
        f"each (LoRA 1.36-1.37x transformers + peft on one H200; {RESULTS})"
    )


def lora_fused(cfg, layout: Layout, kind: Family) -> tuple[bool, str]:
    """lora.fused where it was measured: plain Linear bases in one process or under DDP."""
    if cfg.lora.dropout:
        return False, "adapter dropout: peft's forward applies it"
    if cfg.model.fp8 != "none":
        return False, "float8 base layers multiply in their own kernels"
    if kind.conv1d:
        return False, f"{kind.family}'s Conv1D layers are not nn.Linear"
    if quantized(cfg):
        return False, "the checkpoint's quantized layers multiply in their own kernels"
    if not layout.uses <= {"single", "ddp"}:
        return False, "measured in one process and under DDP only"
    return True, (
        "each adapter's product added inside its base layer's matmul, forward and backward: "
        f"1.01-1.02x peft's layers, 1-4 GiB less on one H100 ({LORA_FUSED})"
    )


def fp8_head(cfg, layout: Layout) -> tuple[bool, str]:
    m = cfg.model
    if m.fp8 == "none":
        return False, "no float8 asked (model.fp8)"
    if m.loss_chunk_tokens or m.kernels not in ("auto", "none") or layout.tp_enabled:
        return False, "the chunked or fused loss, or tensor parallelism, keeps lm_head in bf16"
    return True, (
        "float8 asked: lm_head's matmul too (about a fifth of the 1B shape's FLOPs; losses "
        "0.12-0.13% from bf16's, as measured with it)"
    )
