"""LoRA through peft: base weights frozen, low-rank adapters trained (seed 000 §5)."""

from __future__ import annotations

from torch import nn

from paratrain.config.model import LoraConfig
from paratrain.errors import UserError
from paratrain.models.causal_lm.family import family_of


def apply_lora(model: nn.Module, cfg: LoraConfig) -> nn.Module:
    """Wrap with peft: base weights frozen, adapters trainable. Adapters are kept in fp32 (autocast
    does the low-precision math) so their small updates are not lost to rounding."""
    if not cfg.enabled:
        return model
    from peft import LoraConfig as PeftLora
    from peft import get_peft_model

    family = family_of(model)
    targets = lora_targets(model, cfg)
    names = [n for n, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise UserError(f"lora.target_modules: the model has no module named {missing[0]!r}")
    peft_cfg = PeftLora(
        r=cfg.r,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=targets,
        fan_in_fan_out=family.conv1d,  # Conv1D stores [in, out]: peft transposes its update
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, peft_cfg)
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.float()
    return model


def lora_targets(model_or_config, cfg: LoraConfig) -> list[str]:
    """lora.target_modules, or the model family's default when it is empty (family.py)."""
    return list(cfg.target_modules) or list(family_of(model_or_config).lora_targets)
