"""The speed levers a config may leave at `auto`, and PyTorch's plain setting of each.

runplan/levers.py decides them for a run; what reads a config without a plan (a reference
program given a recipe, a test building a model from the defaults) takes `plain_levers(cfg)`:
every lever still at auto as plain PyTorch runs it, nothing decided.
"""

from __future__ import annotations

import operator
from typing import Any

PLAIN: dict[str, Any] = {
    "train.compile": False,
    "train.compile_mode": "default",
    "train.compile_scope": "blocks",
    "train.fused_optimizer": False,
    "train.bf16_weights": False,
    "train.channels_last": False,
    "train.cudnn_benchmark": False,
    "model.kernels": "none",
    "model.depthwise_conv": "native",
    "model.stem_conv": "native",
    "model.batchnorm": "native",
    "model.fp8_lm_head": False,
    "lora.fused": False,
    "launch.one_process": False,
}


def get(cfg, key: str) -> Any:
    return operator.attrgetter(key)(cfg)


def put(cfg, key: str, value: Any) -> None:
    *path, last = key.split(".")
    setattr(get(cfg, ".".join(path)) if path else cfg, last, value)


def plain_levers(cfg):
    """`cfg` with every lever still at auto given its plain setting (in place; returned)."""
    for key, value in PLAIN.items():
        if get(cfg, key) == "auto":
            put(cfg, key, value)
    return cfg
