"""What paratrain's Triton kernels share: Triton itself when installed, when the kernels run,
and the block index they all start from. Their users: the image layers
(models/depthwise_triton.py, models/batchnorm_triton.py), the language model's loss
(models/causal_lm/ce_triton.py) and MasterAdamW's update (optim/master_adamw_triton.py).

Neutral ground: it imports no part of paratrain, so the optimizers need not import models/.
Every module here imports without Triton (tests/unit/test_without_triton.py)."""

from __future__ import annotations

import os

import torch

try:  # Triton ships with torch's CUDA wheels; CPU-only installs may lack it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - the layers' torch arithmetic needs none of it
    triton = None
    tl = None

block_index = None  # a Triton function where Triton is installed (below); without it the
# modules that import it still import, and their layers take their torch arithmetic

if triton is not None:

    @triton.jit
    def block_index(start, BLOCK: tl.constexpr, BIG: tl.constexpr):
        """start .. start + BLOCK - 1; int64 only where a tensor has 2**31 elements or more
        (int32 offsets are half the registers and address arithmetic)."""
        i = start + tl.arange(0, BLOCK)
        if BIG:
            i = i.to(tl.int64)
        return i


def uses_triton(x: torch.Tensor) -> bool:
    """The kernels run on CUDA tensors, and on CPU ones in Triton's interpreter
    (TRITON_INTERPRET=1, as the tests run them); elsewhere the layers' torch arithmetic."""
    if triton is None:
        return False
    return x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"


def big(*tensors: torch.Tensor) -> bool:
    """Offsets past int32 (with room for a block's masked rows beyond the end)."""
    return max(t.numel() for t in tensors) >= 2**31 - 2**24
