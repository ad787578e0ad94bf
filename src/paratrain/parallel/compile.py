"""torch.compile applied from outside the model: each repeated unit in place (regional), or the
whole model."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn


def apply_compile(
    model: nn.Module, units: Sequence[nn.Module] | None, kwargs: Callable[..., dict]
) -> nn.Module:
    """-> the module to run: `model` itself when its units were compiled in place, else the
    whole model compiled."""
    if not units:
        return torch.compile(model, **kwargs())
    # Regional compilation (as torchtitan does): each decoder layer compiled in place; the
    # layers share one graph, so compile time does not grow with depth, and peft's wrappers
    # and the loss run eagerly around them. FSDP then shards the compiled layers.
    for unit in units:
        # A unit whose forward runs again inside backward (the chunked loss, under activation
        # checkpointing) is compiled without CUDA graphs: replaying a graph then starts a new
        # generation of cudagraph trees, which overwrites the decoder layers' graph outputs
        # that backward still needs ("accessing tensor output of CUDAGraphs that has been
        # overwritten"; reduce-overhead with the chunked loss, H200, torch 2.11)
        graphs = not getattr(unit, "recomputed_in_backward", False)
        unit.compile(**kwargs(cuda_graphs=graphs))
    return model
