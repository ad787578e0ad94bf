"""RunConfig: the owners' leaf configs composed, and the run-wide keys (task, strategy, precision,
device, seed, name, output_dir).

A config says what the user asked for, as written: `strategy: auto`, `task: auto` and
`data.sampler: auto` stay so. What they come to on a given number of processes (degrees, the
wrapper, the sampler, the task, where the model and data come from) is decided once, by
paratrain.runplan.resolve, which is also where settings of different owners are checked
against each other.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from paratrain.config.data import DataConfig
from paratrain.config.gan import GanConfig
from paratrain.config.launch import DistConfig, LaunchConfig
from paratrain.config.model import LoraConfig, ModelConfig
from paratrain.config.parallel import (
    DDPConfig,
    ParallelConfig,
    PipelineConfig,
    SplitConfig,
    SyncConfig,
)
from paratrain.config.train import (
    CheckpointConfig,
    LogConfig,
    Precision,
    ScalerConfig,
    TrainConfig,
)

Strategy = Literal[
    "single", "dp", "ddp-full", "ddp-rr", "ddp-ds", "fsdp", "tp", "pipeline", "split", "auto"
]
TaskName = Literal[
    "auto",
    "image_classification",
    "causal_lm",
    "masked_lm",
    "text_classification",
    "gan",
    "custom",
]


@dataclass(kw_only=True)
class RunConfig:
    name: str = "run"
    """Run name; used in the default output directory and in reports."""
    task: TaskName = "auto"
    """What is trained (a task owns its data, loss and metrics): image_classification,
    causal_lm, masked_lm (BERT-style), text_classification, gan (a generator and a
    discriminator, two optimizers); auto picks by data.source. custom: the model, data sets and
    loss given to paratrain.train from Python (tasks/custom.py)."""
    strategy: Strategy = "auto"
    """A shorthand for parallel.* degrees and data.sampler: single, dp, ddp-full, ddp-rr, ddp-ds,
    fsdp, tp, pipeline, split (see README); auto lets the degrees decide (one process, or ddp-ds
    for launch.nproc > 1, when none is set)."""
    precision: Precision = "fp32"
    """Arithmetic: fp64, fp32 (IEEE), tf32 (CUDA tensor cores), fp16 (autocast + GradScaler), bf16 (autocast)."""
    levers: Literal["auto", "plain"] = "auto"
    """The speed levers left at auto (compile and its mode and scope, the fused optimizer, bf16
    weights, the fused loss, the image kernels, channels_last, cudnn_benchmark, one process for
    one rank): auto lets the plan decide each for this machine and model, printing what it chose
    and why (runplan/levers.py); plain gives each PyTorch's plain setting, as the seed's scripts
    run. A value set explicitly wins either way. Levers that change the numerics beyond noise
    (float8, gradient compression, sync modes, batch sizes) are never decided: the plan hints."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """auto takes CUDA when a GPU is visible, else the CPU (gloo for several processes)."""
    seed: int = 0
    """Seed for weights, shuffling and dropout; equal on every rank."""
    output_dir: str | None = None
    """Where result.json, config.yaml and checkpoints go; default runs/<name>-<time>."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    scaler: ScalerConfig = field(default_factory=ScalerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    log: LogConfig = field(default_factory=LogConfig)
    gan: GanConfig = field(default_factory=GanConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
