"""LoRA through peft: base weights frozen, low-rank adapters trained (seed 000 §5)."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from paratrain.errors import UserError


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
