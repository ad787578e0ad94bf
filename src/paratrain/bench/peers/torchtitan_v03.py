"""What torchtitan 0.3 is given to train paratrain's workload: the config function its own entry
point loads (`torchtitan.train --module paratrain.bench.peers.torchtitan_v03 --config
paratrain_run`), returning a Trainer.Config as torchtitan's own Llama-3 configs do
(models/llama3/config_registry.py), with paratrain's values from torchtitan_args.settings_v03.

Supplied: the model shape in torchtitan's own Llama3Model (its per-layer builder, fused q/k/v,
FlexAttention, init), untied embeddings and unscaled RoPE as the 0.2 peer; paratrain's
random-token rows (torchtitan_args.token_rows, as torchtitan_spec's loader) with per-row
positions (one document per row: a causal mask); no tokenizer (as the 0.2 peer: the rows are
token ids); batch, seq len, steps, schedule, clip norm, float8, compile, log cadence. Its
Trainer, parallelize_llama, compile, AdamW, chunked cross-entropy and loop are its own, and its
defaults stand: CUDA graphs over forward+backward, the spmd_types backend, compiling model and
loss. The loss is subclassed only to keep each step's value on the device (a slot in a device
buffer, written inside the CUDA graph too, no sync), written by rank 0 at exit for the curves.

Read inside torchtitan's processes; the run's config path comes in PARATRAIN_TT_CONFIG, the
per-step losses go to PARATRAIN_TT_LOSSES, the options in effect to PARATRAIN_TT_OPTIONS.
"""

from __future__ import annotations

import atexit
import json
import os
from dataclasses import dataclass
from typing import Any

import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
from torchtitan.components.tokenizer import BaseTokenizer
from torchtitan.config import CompileConfig, DebugConfig, TrainingConfig
from torchtitan.distributed.activation_checkpoint import FullAC
from torchtitan.distributed.pipeline_parallel import pipeline_llm
from torchtitan.models import llama3
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.llama3 import Llama3Model, parallelize_llama
from torchtitan.models.utils import validate_converter_order
from torchtitan.protocols.model_spec import ModelSpec
from torchtitan.trainer import Trainer

from paratrain.bench.peers.torchtitan_args import (
    V03_LOSS_CHUNKS,
    installed_version,
    run_config,
    settings_v03,
    token_rows,
)

NAME = "paratrain"
ATTENTION = "flex"  # torchtitan's model_registry default (it refuses sdpa for language models)
ROPE_MAX_SEQ_LEN = 131072  # its Llama-3 flavors'; the Trainer cuts the cache to training.seq_len


class RowsLoader(BaseDataLoader):
    """Batches of paratrain's random-token rows (seq_len + 1 tokens: inputs and next-token
    labels), this data-parallel rank's share, cycled as epochs, with the positions torchtitan's
    own loaders give (0..seq_len-1: each row one document). Nothing to checkpoint."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        pass

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        seq_len: int,
        local_batch_size: int,
        **_: Any,
    ):
        rows = token_rows(run_config(), seq_len + 1)
        self.rows, self.batch = rows[dp_rank::dp_world_size], local_batch_size
        self.positions = torch.arange(seq_len).expand(local_batch_size, seq_len).contiguous()

    def __iter__(self):
        while True:
            for first in range(0, len(self.rows) - self.batch + 1, self.batch):
                chunk = self.rows[first : first + self.batch]
                inputs = {"input": chunk[:, :-1].contiguous(), "positions": self.positions}
                yield inputs, chunk[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


class NoTokenizer(BaseTokenizer):
    """The 0.2 peer's tokenizer: none. The rows are token ids already; torchtitan only hands
    the tokenizer to the loader, which does not use it."""

    @dataclass(kw_only=True, slots=True)
    class Config(BaseTokenizer.Config):
        vocab_size: int = 0

    def __init__(self, config: Config, **_: Any):
        super().__init__()
        self.vocab_size = config.vocab_size

    def encode(self, *args, **kwargs) -> list[int]:
        raise RuntimeError("the torchtitan peer's rows are token ids; nothing is tokenized")

    def decode(self, *args, **kwargs) -> str:
        raise RuntimeError("the torchtitan peer's rows are token ids; nothing is tokenized")

    def get_vocab_size(self) -> int:
        return self.vocab_size


_RECORDERS: list[RecordingLoss] = []


class RecordingLoss(ChunkedLossWrapper):
    """torchtitan's chunked cross-entropy (its Llama configs' loss), unchanged; each training
    call's value, rank 0's mean per token, kept in a device buffer at a device-side counter, so
    the write is replayed by the CUDA graph each step and nothing syncs. Every label is a real
    token, so the local sum over labels.numel() is the mean."""

    @dataclass(kw_only=True, slots=True)
    class Config(ChunkedLossWrapper.Config):
        record_steps: int = 0
        """Slots for the per-step losses (training.steps)."""

    def __init__(self, config: Config, **kwargs: Any):
        super().__init__(config, **kwargs)
        self.capacity = max(1, config.record_steps)
        self.values: torch.Tensor | None = None
        self.count: torch.Tensor | None = None

    def __call__(self, pred, labels, global_valid_tokens=None, **loss_inputs):
        loss, metrics = super().__call__(pred, labels, global_valid_tokens, **loss_inputs)
        if pred.requires_grad:  # training, not validation
            self._record(loss.detach().float(), labels, global_valid_tokens)
        return loss, metrics

    def _record(self, value: torch.Tensor, labels: torch.Tensor, global_valid_tokens) -> None:
        if self.values is None:  # the first step runs eagerly (torchtitan's graph warm-up)
            self.values = torch.zeros(self.capacity, device=value.device)
            self.count = torch.zeros((), dtype=torch.long, device=value.device)
            _RECORDERS.append(self)
        if global_valid_tokens is not None:  # loss = local sum / global tokens
            value = value * global_valid_tokens / labels.numel()
        slot = self.count.clamp(max=self.capacity - 1).reshape(1)
        self.values.index_copy_(0, slot, value.reshape(1))
        self.count.add_(1)

    def recorded(self) -> list[float]:
        if self.values is None:
            return []
        n = min(int(self.count), self.capacity)
        return self.values[:n].cpu().tolist()


def _write_losses() -> None:
    path = os.environ.get("PARATRAIN_TT_LOSSES")
    if path and int(os.environ.get("RANK", "0")) == 0 and _RECORDERS:
        with open(path, "w") as f:
            json.dump(_RECORDERS[0].recorded(), f)


def model_config(shape: dict) -> Llama3Model.Config:
    """paratrain's shape as torchtitan's Llama-3 flavors are written (models/llama3/__init__.py,
    `_8b`: untied; `_1b`: tied, its embedding init skipped for the shared weight), built by its
    own per-layer builder; every RMSNorm given the shape's eps."""
    dim, n_heads, vocab = shape["dim"], shape["n_heads"], shape["vocab_size"]
    tied = shape["tie_embeddings"]
    config = Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        enable_weight_tying=tied,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab,
            embedding_dim=dim,
            param_init=llama3._EMBEDDING_SKIP_INIT if tied else llama3._EMBEDDING_INIT,
        ),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=llama3._NORM_INIT),
        lm_head=Linear.Config(
            in_features=dim, out_features=vocab, param_init=llama3._output_linear_init(dim)
        ),
        layers=llama3._build_llama3_layers(
            fuse_qkv=True,
            n_layers=shape["n_layers"],
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=shape["n_kv_heads"],
            hidden_dim=shape["hidden_dim"],
            rope=ComplexRoPE.Config(
                dim=dim // n_heads,
                max_seq_len=ROPE_MAX_SEQ_LEN,
                theta=shape["rope_theta"],
                scaling=shape["rope_scaling"],
            ),
            attn_backend=ATTENTION,
        ),
    )
    for _, norm, _, _ in config.traverse(RMSNorm.Config):
        norm.eps = shape["norm_eps"]
    return config


def model_spec(settings: dict, flavor: str) -> ModelSpec:
    """As torchtitan's llama3.model_registry: the model config, converted by its float8
    converter where asked, with its Llama parallelize and pipelining functions. No state-dict
    adapter: no Hugging Face checkpoint is read or written."""
    config = model_config(settings["shape"])
    if settings["float8"] is not None:
        from torchtitan.components.quantization import Float8LinearConverter

        converters = [
            Float8LinearConverter.Config(
                **settings["float8"], model_compile_enabled=settings["compile"]
            )
        ]
        validate_converter_order(converters)
        for c in converters:
            config = c.build().convert(config)
    return ModelSpec(
        name=NAME,
        flavor=flavor,
        model=config,
        parallelize_fn=parallelize_llama,
        pipelining_fn=pipeline_llm,
        post_optimizer_build_fn=None,
        state_dict_adapter=None,
    )


def trainer_config(settings: dict, flavor: str = "shape") -> Trainer.Config:
    """torchtitan's Trainer.Config for settings_v03's values; every other field its default."""
    o, vocab = settings["optimizer"], settings["shape"]["vocab_size"]
    optimizer = default_adamw(
        lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"]
    )
    optimizer.implementation = o["implementation"]
    return Trainer.Config(
        model_spec=model_spec(settings, flavor),
        loss=RecordingLoss.Config(
            num_chunks=V03_LOSS_CHUNKS,
            loss_fn=CrossEntropyLoss.Config(global_vocab_size=vocab),
            record_steps=settings["training"]["steps"],
        ),
        tokenizer=NoTokenizer.Config(vocab_size=vocab),
        dataloader=RowsLoader.Config(),
        optimizer=optimizer,
        lr_scheduler=LRSchedulersContainer.Config(**settings["lr_scheduler"]),
        training=TrainingConfig(**settings["training"]),
        activation_checkpoint=(
            FullAC.Config() if settings["activation_checkpoint"] == "full" else None
        ),
        compile=CompileConfig(enable=settings["compile"]),
        metrics=MetricsProcessor.Config(log_freq=settings["log_freq"]),
        debug=DebugConfig(seed=settings["seed"]),
    )


def _name(config: object | None) -> str | None:
    return None if config is None else type(config).__qualname__.removesuffix(".Config")


def options(config: Trainer.Config) -> dict:
    """The options in effect that paratrain did not choose (torchtitan's defaults) and the
    stand-ins, for result.json (torchtitan's full config: job_config.json in its dump folder)."""
    model = config.model_spec.model
    attention = model.first_attention
    linears = {_name(c) for _, c, _, _ in model.traverse(Linear.Config)}
    return {
        "torchtitan": installed_version(),
        "cuda_graphs": not config.training.disable_cuda_graphs,
        "attention": _name(attention.inner_attention),
        "qkv": _name(attention.qkv_linear),
        "rope": _name(attention.rope) + f" scaling={attention.rope.scaling}",
        "tied_embeddings": model.enable_weight_tying,
        "linear_layers": sorted(linears),
        "loss": f"{_name(config.loss)}({_name(config.loss.loss_fn)}, "
        f"num_chunks={config.loss.num_chunks})",
        "compile": {
            "enable": config.compile.enable,
            "components": list(config.compile.components),
            "backend": config.compile.backend,
        },
        "spmd_backend": config.parallelism.spmd_backend,
        "optimizer": f"AdamW {config.optimizer.implementation}",
        "activation_checkpoint": _name(config.activation_checkpoint),
        "mixed_precision_param": config.training.mixed_precision_param,
        "tokenizer": _name(config.tokenizer),
        "dataloader": _name(config.dataloader),
    }


def paratrain_run() -> Trainer.Config:
    """The config function named on the command line (torchtitan_args.V03_CONFIG)."""
    cfg = run_config()
    config = trainer_config(settings_v03(cfg), flavor=cfg.model.shape)
    path = os.environ.get("PARATRAIN_TT_OPTIONS")
    if path and int(os.environ.get("RANK", "0")) == 0:
        with open(path, "w") as f:
            json.dump(options(config), f, indent=1)
    atexit.register(_write_losses)
    return config
