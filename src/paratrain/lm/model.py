"""Causal LMs through HF transformers, LoRA through peft, and the FLOPs that MFU divides by."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from paratrain.errors import UserError

# Llama shapes for random-init throughput work (no weights needed). From the models' config.json.
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
    "llama3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    # A few hundred thousand parameters: CPU tests. Its vocabulary holds the byte tokenizer's 259.
    "tiny": dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
}


@dataclass(kw_only=True)
class LoraConfig:
    enabled: bool = True
    """Train low-rank adapters only (peft); false trains every weight."""
    r: int = 8
    """Rank of the adapters (the seed's 8)."""
    alpha: float = 16.0
    """Scale: the adapter's update is multiplied by alpha / r."""
    dropout: float = 0.0
    """Dropout on the adapter's input."""
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj", "o_proj"])
    """Linear layers that get adapters (Llama names: q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)."""
    save_merged: bool = False
    """Also save the base model with the adapters merged in (full size)."""

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"r: must be >= 1, got {self.r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout: must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError("target_modules: name at least one module, e.g. q_proj")


def build_causal_lm(
    path: str | None,
    init: str,
    shape: str | None,
    attn: str,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> nn.Module:
    """Random init builds straight on `device` in `dtype` (an 8B model in fp32 on the host would be
    32 GB and minutes of single-threaded init); pretrained weights load on the host."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if init == "random":
        if path is not None:
            config = AutoConfig.from_pretrained(path)
            config._attn_implementation = attn
            with building(dtype, device):
                return AutoModelForCausalLM.from_config(config, dtype=dtype)
        config = LlamaConfig(**SHAPES[shape], attn_implementation=attn)
        with building(dtype, device):
            return LlamaForCausalLM(config)
    if not Path(path).is_dir():
        raise UserError(f"model.path: no such directory {path} (a Hugging Face checkpoint)")
    try:
        return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn)
    except (OSError, ValueError) as e:
        raise UserError(
            f"model.path: cannot load {path} ({str(e).splitlines()[0][:200]})"
        ) from None


@contextlib.contextmanager
def building(dtype: torch.dtype, device: torch.device | str):
    """New tensors in `dtype` on `device` (torch's default-dtype and device context)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def apply_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Wrap with peft: base weights frozen, adapters trainable. Adapters are kept in fp32 (autocast
    does the low-precision math) so their small updates are not lost to rounding."""
    if not cfg.enabled:
        return model
    from peft import LoraConfig as PeftLora
    from peft import get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in cfg.target_modules if t not in names]
    if missing:
        raise UserError(f"lora.target_modules: the model has no module named {missing[0]!r}")
    peft_cfg = PeftLora(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, peft_cfg)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return model


def check_kernels(kernels: str, device_type: str) -> None:
    """model.kernels needs a CUDA device and the liger-kernel package (checked before launch)."""
    if kernels == "none":
        return
    if device_type != "cuda":
        raise UserError(
            f"model.kernels: {kernels} runs Triton kernels on CUDA GPUs; this run is on {device_type}"
        )
    try:
        import liger_kernel  # noqa: F401
    except ImportError:
        raise UserError(
            f"model.kernels: {kernels} needs the liger-kernel package (pip install liger-kernel)"
        ) from None


def apply_kernels(model: nn.Module, kernels: str, device: torch.device) -> nn.Module:
    """Swap fused Triton kernels into a transformers model instance (before LoRA wraps it).

    liger: Liger-Kernel's RMSNorm, rotary embedding and SwiGLU MLP, found by the config's
    model_type. Its fused linear cross-entropy (also the whole of liger-loss) is applied by the
    loss wrapper (lm/loss.py), not by patching the model's forward, so the same loss path serves
    every strategy.
    """
    if kernels == "none":
        return model
    check_kernels(kernels, device.type)
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    if kernels == "liger-loss":
        return model  # the loss wrapper does it all
    model_type = model.config.model_type
    patch = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if patch is None:
        raise UserError(f"model.kernels: liger-kernel has no kernels for model type {model_type!r}")
    patch(
        rope=True,
        rms_norm=True,
        swiglu=True,
        cross_entropy=False,
        fused_linear_cross_entropy=False,
        model=model,
    )
    return model


def check_fp8(recipe: str, device: torch.device | str) -> None:
    """model.fp8 needs torchao and float8 matmuls (compute capability 8.9+, or the CPU)."""
    if recipe == "none":
        return
    try:
        import torchao.float8  # noqa: F401
    except ImportError:
        raise UserError(
            f"model.fp8: {recipe} needs the torchao package (pip install torchao)"
        ) from None
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise UserError(
            f"model.fp8: float8 matmuls need compute capability 8.9+ (H100, H200); {name} has less"
        )


def apply_fp8(model: nn.Module, recipe: str, device: torch.device) -> nn.Module:
    """Swap the decoder's nn.Linear layers for torchao's Float8Linear (before LoRA wraps them:
    peft then adds its adapters around the float8 base layers). lm_head stays in high precision,
    as torchao and torchtitan advise for the output layer; so do layers whose sizes are not
    multiples of 16, which float8 matmuls cannot take."""
    if recipe == "none":
        return model
    check_fp8(recipe, device)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    def eligible(module: nn.Module, name: str) -> bool:
        return (
            isinstance(module, nn.Linear)
            and "lm_head" not in name
            and module.in_features % 16 == 0
            and module.out_features % 16 == 0
        )

    return convert_to_float8_training(
        model, config=Float8LinearConfig.from_recipe_name(recipe), module_filter_fn=eligible
    )


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (under a peft wrapper too): the unit of FSDP sharding."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(getattr(inner, "model", None), "layers", None)
    if layers is None:
        raise UserError("strategy: fsdp shards per decoder layer; this model has no model.layers")
    return list(layers)


# ---------------------------------------------------------------------------- FLOPs and MFU


def flops_per_token(model: nn.Module, seq_len: int, lora: bool) -> float:
    """Training FLOPs per token.

    Full training: 6N (2N forward, 4N backward: gradients for activations and for weights; PaLM,
    Chowdhery et al. 2022, App. B) plus attention 12 * layers * hidden * seq_len.
    LoRA: the frozen weights need no weight gradients, so 4N (2N forward, 2N for activation
    gradients) plus the same attention term (its score/value products have no weights and run
    forward and backward whatever is trained), plus 6 x the adapters' own parameters.
    N counts non-embedding parameters of the base model (the embedding lookup is not a matmul).
    """
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = inner.config
    embed = cfg.vocab_size * cfg.hidden_size
    base = sum(p.numel() for n, p in inner.named_parameters() if "lora_" not in n) - embed
    attention = 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len
    if not lora:
        return 6 * base + attention
    adapters = sum(p.numel() for n, p in inner.named_parameters() if "lora_" in n)
    return 4 * base + attention + 6 * adapters


# Dense bf16/fp16 tensor-core peaks (vendor datasheets, without sparsity), in FLOP/s.
PEAK_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "RTX 4090": 165e12,
}


def peak_flops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_FLOPS.items():
        if key in name:
            return value
    return None
