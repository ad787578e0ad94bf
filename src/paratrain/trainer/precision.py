"""Precision policy: parameter dtype, autocast dtype, loss scaling and TF32 switches.

Seed 000 §3 compares FP64, FP32 and FP16 (AMP + GradScaler, init_scale 65536, growth 2.0,
interval 2000). We add tf32 (FP32 storage, tensor-core matmuls/convs on CUDA) and bf16
(autocast, no scaler: bf16 has FP32's exponent range, so gradients do not underflow).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from paratrain.config.train import Precision, ScalerConfig
from paratrain.errors import UserError


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    param_dtype: torch.dtype
    """Dtype of weights, optimizer state and inputs (float64 for fp64, else float32)."""
    autocast_dtype: torch.dtype | None
    device_type: str

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)


def build_policy(precision: Precision, device: torch.device) -> PrecisionPolicy:
    """Also sets the process-wide TF32 switches, which only the chosen mode should decide."""
    if device.type == "cuda":
        # PyTorch lets cuDNN use TF32 by default; "fp32" here means IEEE FP32 so that fp32 and
        # tf32 are two honest rows of a table rather than the same thing twice.
        tf32 = precision == "tf32"
        torch.backends.cudnn.allow_tf32 = tf32
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
    elif precision == "tf32":
        raise UserError("precision: tf32 is a CUDA tensor-core mode; on the CPU use fp32 or bf16")
    autocast = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    param = torch.float64 if precision == "fp64" else torch.float32
    return PrecisionPolicy(precision, param, autocast, device.type)


def build_scaler(precision: Precision, cfg: ScalerConfig, device: torch.device):
    """A GradScaler for fp16 (the only mode whose gradients can underflow), else None."""
    if precision != "fp16":
        return None
    return torch.amp.GradScaler(
        device.type,
        init_scale=cfg.init_scale,
        growth_factor=cfg.growth_factor,
        backoff_factor=cfg.backoff_factor,
        growth_interval=cfg.growth_interval,
    )
