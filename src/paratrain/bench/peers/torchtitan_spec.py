"""What torchtitan is given to train paratrain's workload, through its own hook
(`--experimental.custom_import paratrain.bench.peers.torchtitan_spec`): a TrainSpec named
`paratrain` whose flavor `shape` is paratrain's model shape in torchtitan's own Llama
(TransformerModelArgs), and whose loader gives paratrain's random-token rows. Everything else is
torchtitan's own: its model, parallelize_llama (compile, activation checkpointing, FSDP), its
optimizers, schedulers and cross-entropy loss. The loss is wrapped only to keep each step's
value on the device (no sync), written by rank 0 at exit for the loss curves.

Read inside torchtitan's processes; the run's config path comes in PARATRAIN_TT_CONFIG, the
per-step losses go to PARATRAIN_TT_LOSSES.
"""

from __future__ import annotations

import atexit
import json
import os

import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import build_cross_entropy_loss
from torchtitan.components.lr_scheduler import build_lr_schedulers
from torchtitan.components.optimizer import build_optimizers
from torchtitan.models.llama3.infra.parallelize import parallelize_llama
from torchtitan.models.llama3.model.args import RoPEScalingArgs, TransformerModelArgs
from torchtitan.models.llama3.model.model import Transformer
from torchtitan.protocols.train_spec import TrainSpec, register_train_spec

from paratrain.bench.peers.torchtitan_args import model_args, run_config, token_rows

NAME = "paratrain"
_LOSSES: list[torch.Tensor] = []


class RowsLoader(BaseDataLoader):
    """Batches of paratrain's random-token rows (length seq_len + 1: inputs and next-token
    labels), this data-parallel rank's share, cycled as epochs. Nothing to checkpoint."""

    def __init__(self, rows: torch.Tensor, batch: int, dp_rank: int, dp_world: int):
        self.rows, self.batch = rows[dp_rank::dp_world], batch

    def __iter__(self):
        while True:
            for first in range(0, len(self.rows) - self.batch + 1, self.batch):
                chunk = self.rows[first : first + self.batch]
                yield {"input": chunk[:, :-1].contiguous()}, chunk[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


def build_loader(dp_world_size: int, dp_rank: int, tokenizer, job_config, **_):
    cfg = run_config()
    rows = token_rows(cfg, job_config.training.seq_len + 1)
    return RowsLoader(rows, job_config.training.local_batch_size, dp_rank, dp_world_size)


def build_loss(job_config, **kwargs):
    """torchtitan's own loss (compiled when it compiles the loss); each call's mean per token
    kept on the device for the curve (rank 0's rows: on one GPU, the step's loss). Every label
    is a real token, so sum / numel is the mean."""
    inner = build_cross_entropy_loss(job_config, **kwargs)

    def loss(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        value = inner(pred, labels)
        _LOSSES.append(value.detach() / labels.numel())
        return value

    return loss


def _write_losses() -> None:
    path = os.environ.get("PARATRAIN_TT_LOSSES")
    if path and int(os.environ.get("RANK", "0")) == 0 and _LOSSES:
        with open(path, "w") as f:
            json.dump(torch.stack(_LOSSES).float().cpu().tolist(), f)


def register() -> None:
    args = model_args(run_config())
    register_train_spec(
        NAME,
        TrainSpec(
            model_cls=Transformer,
            # torchtitan applies Llama-3.1's RoPE scaling by default (factor 8); paratrain's
            # shapes have none: a factor of 1 makes its formula the identity
            model_args={
                "shape": TransformerModelArgs(
                    **args, rope_scaling_args=RoPEScalingArgs(scaling_factor=1.0)
                )
            },
            parallelize_fn=parallelize_llama,
            pipelining_fn=None,
            build_optimizers_fn=build_optimizers,
            build_lr_schedulers_fn=build_lr_schedulers,
            build_dataloader_fn=build_loader,
            build_tokenizer_fn=None,
            build_loss_fn=build_loss,
        ),
    )
    atexit.register(_write_losses)


register()
