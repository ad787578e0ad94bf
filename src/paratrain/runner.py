"""From a validated RunConfig to training: check the host, then train here or hand the run to
torchrun's agent (launch.py), and report where the result went."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from paratrain import launch
from paratrain.config import RunConfig, to_yaml
from paratrain.data.loader import TEXT_FORMATS
from paratrain.data.sources import find_mnist_files
from paratrain.errors import UserError
from paratrain.lm.data import check_path
from paratrain.lm.model import check_fp8, check_kernels
from paratrain.models import resolve_builder
from paratrain.parallel import STRATEGIES
from paratrain.tasks import task_of
from paratrain.train import default_output_dir, train


def preflight(cfg: RunConfig, nproc: int) -> None:
    """Checks that need this machine (GPUs, files): done once, before any process starts."""
    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "device: cuda was asked for but no GPU is visible (check CUDA_VISIBLE_DEVICES)"
        )
    if not cuda and cfg.precision == "tf32":
        raise UserError(
            "precision: tf32 is a CUDA tensor-core mode and no GPU is in use; use fp32 or bf16"
        )
    if not cuda and cfg.data.resize_on == "gpu":
        raise UserError("data.resize_on: gpu needs a GPU and none is in use; use cpu")
    if cuda and STRATEGIES[cfg.strategy].multiprocess and nproc > torch.cuda.device_count():
        raise UserError(
            f"launch.nproc: {nproc} processes but {torch.cuda.device_count()} GPUs visible; "
            "use at most one process per GPU, or device=cpu"
        )
    # Missing files are named now, in one line, not by N workers; only their presence is checked
    # (the workers read them), so a 60,000-image data set is not loaded twice.
    if cfg.data.source == "mnist":
        for train_split in (True, False):
            find_mnist_files(cfg.data.path, train_split)
    elif cfg.data.source == "imagefolder" and not Path(cfg.data.path).is_dir():
        raise UserError(
            f"data.path: no such folder {cfg.data.path} (one sub-folder of images per class)"
        )
    if task_of(cfg.data.source) == "lm":
        check_kernels(cfg.model.kernels, "cuda" if cuda else "cpu")
        check_fp8(cfg.model.fp8, "cuda" if cuda else "cpu")
    if cfg.data.source in TEXT_FORMATS:
        check_path(cfg.data.path)
        if cfg.model.path is not None and not Path(cfg.model.path).is_dir():
            raise UserError(
                f"model.path: no such directory {cfg.model.path} (a Hugging Face checkpoint)"
            )
    else:
        resolve_builder(cfg.model.name)  # a user's "module:function" that does not import


def execute(cfg: RunConfig) -> int:
    spec = STRATEGIES[cfg.strategy]
    slurm = None if launch.launched_by_torchrun() else launch.slurm_rank_env()
    if slurm:
        os.environ.update(slurm)
    if launch.launched_by_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if not spec.multiprocess and world > 1:
            raise UserError(
                f"strategy: {cfg.strategy} runs in one process but this job has {world}; use ddp-ds"
            )
        if int(os.environ.get("RANK", "0")) == 0:
            preflight(cfg, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
        train(cfg)
        return 0

    nproc = cfg.launch.nproc or launch.default_nproc(spec.multiprocess)
    preflight(cfg, nproc)
    if not spec.multiprocess:
        train(cfg)
        return 0

    cfg.output_dir = cfg.output_dir or default_output_dir(cfg.name)
    cfg.launch.nproc = nproc
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    config_path = out / "config.yaml"
    config_path.write_text(to_yaml(cfg))
    argv = launch.torchrun_argv(cfg.launch, nproc, config_path)
    print(f"paratrain: torchrun {' '.join(argv)}", flush=True)
    try:
        launch.run_torchrun(argv)
    except Exception as e:  # torchrun's ChildFailedError: the workers printed their own errors
        name = type(e).__name__
        print(
            f"paratrain: training failed ({name}); the workers' errors are above", file=sys.stderr
        )
        return 1
    return 0
