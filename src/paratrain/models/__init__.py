"""Models by name, or the user's own as ``module.path:builder``.

A builder is ``builder(num_classes: int, in_channels: int) -> nn.Module``. Models never branch
on the strategy: parallelism is applied from outside (paratrain.parallel).
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from collections.abc import Callable

from torch import nn

from paratrain import trust
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
    module_name, fn_name = name.split(":", 1)
    if module_name == "timm":  # timm's models by name, its own argument names
        return timm_builder(fn_name)
    # the user's module beside them, as `python -m paratrain` finds it (the paratrain command's
    # path starts at its own script): the working directory is searched last
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())
    trust.check(module_name)  # a handed recipe or config names no code that runs unasked
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
        model = call_builder(builder, cfg.name, num_classes, in_channels, cfg.kwargs)
    except UserError:
        raise
    except Exception as e:
        if cfg.name in MODELS:  # paratrain's own builders: a bug, with its traceback
            raise
        raise UserError(f"model.name: {cfg.name} raised {type(e).__name__}: {e}") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"model.name: {cfg.name} returned {type(model).__name__}, not an nn.Module")
    apply_layer_swaps(model, cfg)
    return model


def apply_layer_swaps(model: nn.Module, cfg: ModelConfig) -> None:
    """The image model's layers in other forms: model.depthwise_conv, model.batchnorm."""
    apply_depthwise_conv(model, cfg)
    if cfg.batchnorm == "triton":
        from paratrain.models.batchnorm_triton import triton_batchnorm

        if triton_batchnorm(model) == 0:
            raise UserError(f"model.batchnorm: {cfg.name} has no BatchNorm2d layer")


def call_builder(builder, name: str, num_classes: int, in_channels: int, kwargs: dict):
    """builder(num_classes=, in_channels=, **model.kwargs), passing only the arguments its
    signature takes (a builder of its own may need neither); a refused keyword is one line
    naming it."""
    offered = {"num_classes": num_classes, "in_channels": in_channels}
    try:
        params = inspect.signature(builder).parameters
    except (TypeError, ValueError):  # a builtin or C function: no signature to read
        params = {}
    if params and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        offered = {k: v for k, v in offered.items() if k in params}
    try:
        return builder(**offered, **kwargs)
    except TypeError as e:
        refused = [k for k in (*offered, *kwargs) if f"'{k}'" in str(e)]
        if not refused or name in MODELS:
            raise
        if refused[0] in kwargs:
            raise UserError(f"model.kwargs: {name} does not take them: {e}") from None
        raise UserError(
            f"model.name: {name} does not take {refused[0]}, which paratrain passes "
            f"({refused[0]}={offered[refused[0]]}): {e}"
        ) from None


def timm_builder(name: str) -> Callable[..., nn.Module]:
    """model.name=timm:NAME: timm.create_model(NAME) with random weights (nothing is
    downloaded) and paratrain's num_classes and in_channels under timm's names (in_chans);
    timm:create_model takes the name from model.kwargs.model_name."""
    try:
        import timm
    except ImportError:
        raise UserError("model.name: timm is not installed (pip install timm)") from None

    def build(num_classes: int, in_channels: int, model_name: str = name, **kwargs):
        return timm.create_model(
            model_name, pretrained=False, num_classes=num_classes, in_chans=in_channels, **kwargs
        )

    if name != "create_model" and not timm.is_model(name):
        close = difflib.get_close_matches(name, timm.list_models(), n=1)
        hint = f"; did you mean timm:{close[0]}?" if close else ""
        raise UserError(f"model.name: timm has no model {name!r}{hint}")
    return build


def apply_depthwise_conv(model: nn.Module, cfg: ModelConfig) -> None:
    """model.depthwise_conv=shift-add / triton: swap the depthwise layers (models/depthwise.py,
    models/depthwise_triton.py)."""
    if cfg.depthwise_conv not in ("native", "auto"):  # auto: not decided (no plan) is native
        from paratrain.models.depthwise import (
            ShiftAddDepthwise,
            is_depthwise,
            is_one_channel,
            swap_depthwise,
        )
        from paratrain.models.depthwise_triton import TritonDepthwise

        form = TritonDepthwise if cfg.depthwise_conv == "triton" else ShiftAddDepthwise
        sides = (cfg.shift_add_min_side, is_depthwise, cfg.strided_min_side)
        if swap_depthwise(model, form, *sides) == 0:
            raise UserError(f"model.depthwise_conv: {cfg.name} has no depthwise convolution")
        stem = cfg.stem_conv == "depthwise"
        if stem and swap_depthwise(model, form, cfg.shift_add_min_side, is_one_channel) == 0:
            raise UserError(
                f"model.stem_conv: {cfg.name} has no convolution from one input channel "
                "(data.channels=1 gives MobileNetV2 one)"
            )
