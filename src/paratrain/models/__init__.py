"""Models by name, or the user's own as ``module.path:builder``.

A builder is ``builder(num_classes: int, in_channels: int) -> nn.Module``. Models never branch
on the strategy: parallelism is applied from outside (paratrain.parallel).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from torch import nn

from paratrain.config.model import IMAGE_MODELS, ModelConfig
from paratrain.errors import UserError
from paratrain.models.vision import build_mobilenet_v2, build_resnet50, build_tiny_cnn

MODELS: dict[str, Callable[..., nn.Module]] = {
    "mobilenet_v2": build_mobilenet_v2,
    "resnet50": build_resnet50,
    "tiny_cnn": build_tiny_cnn,
}
assert tuple(MODELS) == IMAGE_MODELS  # the names model.name accepts (config/model.py)


def resolve_builder(name: str) -> Callable[..., nn.Module]:
    if name in MODELS:
        return MODELS[name]
    module_name, fn_name = name.split(":")
    # the user's module beside them, as `python -m paratrain` finds it (the paratrain command's
    # path starts at its own script): the working directory is searched last
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"model.name: cannot import {module_name!r} ({e})") from None
    except Exception as e:  # the user's module itself fails: a syntax error, a raise at import
        raise UserError(
            f"model.name: importing {module_name!r} failed: {type(e).__name__}: {e}"
        ) from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise UserError(f"model.name: {module_name} has no function {fn_name!r}")
    return fn


def build_model(cfg: ModelConfig, num_classes: int, in_channels: int) -> nn.Module:
    builder = resolve_builder(cfg.name)
    try:
        model = builder(num_classes=num_classes, in_channels=in_channels, **cfg.kwargs)
    except TypeError as e:
        if cfg.kwargs and "argument" in str(e):  # a keyword the builder does not take
            raise UserError(f"model.kwargs: {cfg.name} does not take them: {e}") from None
        if cfg.name in MODELS:
            raise
        raise UserError(f"model.name: {cfg.name} raised TypeError: {e}") from None
    except Exception as e:
        if cfg.name in MODELS:  # paratrain's own builders: a bug, with its traceback
            raise
        raise UserError(f"model.name: {cfg.name} raised {type(e).__name__}: {e}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"model.name: {cfg.name} returned {type(model).__name__}, not an nn.Module")
    apply_depthwise_conv(model, cfg)
    return model


def apply_depthwise_conv(model: nn.Module, cfg: ModelConfig) -> None:
    """model.depthwise_conv=shift-add: swap the depthwise layers (models/depthwise.py)."""
    if cfg.depthwise_conv == "shift-add":
        from paratrain.models.depthwise import shift_add_depthwise

        if shift_add_depthwise(model, cfg.shift_add_min_side) == 0:
            raise UserError(f"model.depthwise_conv: {cfg.name} has no depthwise convolution")
