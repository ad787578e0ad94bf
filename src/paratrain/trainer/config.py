"""The optimizer a TrainConfig names (config/train.py holds the settings): for paratrain's
loop and the peers' reference programs alike."""

from __future__ import annotations

from paratrain.config.train import TrainConfig

LOW_BIT = {"adamw8bit": "AdamW8bit", "adamw4bit": "AdamW4bit", "adamw-fp8": "AdamWFp8"}


def build_optimizer(params, tc: TrainConfig, masters=None):
    """The optimizer tc names, for paratrain's loop and the reference programs alike. masters:
    train.bf16_weights' fp32 values of the bf16 weights (optim/master_adamw.py)."""
    import torch

    fused = tc.fused_optimizer or None  # None: PyTorch's default (foreach on CUDA)
    if tc.optimizer in LOW_BIT:  # torchao compiles each state's update itself
        import torchao.optim

        kind = getattr(torchao.optim, LOW_BIT[tc.optimizer])
        return kind(params, lr=tc.lr, weight_decay=tc.weight_decay)
    if tc.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=tc.lr, momentum=tc.momentum, weight_decay=tc.weight_decay, fused=fused
        )
    betas = (tc.adam_beta1, tc.adam_beta2)
    if tc.bf16_weights:
        from paratrain.optim.master_adamw import MasterAdamW

        return MasterAdamW(params, masters, lr=tc.lr, betas=betas, weight_decay=tc.weight_decay)
    return torch.optim.AdamW(
        params, lr=tc.lr, betas=betas, weight_decay=tc.weight_decay, fused=fused
    )
