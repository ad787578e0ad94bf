"""Swapping a model's submodules in place (float8 layers, shift-add depthwise convolutions)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def swap_modules(
    model: nn.Module, pick: Callable[[nn.Module], bool], make: Callable[[nn.Module], nn.Module]
) -> int:
    """Replace every submodule `pick` accepts with `make(submodule)`; returns how many. The
    swaps are listed first: replacing while named_children() walks would skip or revisit."""
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if pick(child)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, make(child))
    return len(swaps)
