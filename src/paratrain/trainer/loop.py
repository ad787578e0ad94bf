"""train(plan): one rank's part of a run. The process group, then the Trainer (trainer.py:
the run built once, its components, and `fit`, the loop), then the process group's end.

Every rank runs this function; rank 0 alone prints, shows the bar and writes files.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from paratrain.distributed import flight
from paratrain.distributed import process_group as pg
from paratrain.trainer.measure import gc_schedule, sdpa_priority
from paratrain.trainer.setup import deterministic_env


def train(plan) -> dict[str, Any]:
    """Train the run `plan` (a runplan.RunPlan, resolved before: the trainer never re-enters
    the plan) describes, on this process's rank."""
    from paratrain.launch.torchrun import threads_per_process
    from paratrain.trainer.trainer import Trainer

    cfg = plan.config
    deterministic_env(cfg)
    torch.set_num_threads(
        threads_per_process(cfg.launch, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    )
    if plan.multiprocess:
        flight.enable(
            cfg.dist.flight_recorder,
            Path(cfg.output_dir) / "flight_recorder" if cfg.output_dir else None,
            cuda=cfg.device != "cpu" and torch.cuda.is_available(),
        )
    env = pg.init_distributed(cfg.device, plan.multiprocess, cfg.dist.timeout_s)
    try:
        with sdpa_priority(cfg.train.sdpa_backend), gc_schedule(cfg.train.gc_every_steps):
            return Trainer(plan, env).fit()
    except Exception as e:
        # a collective that failed for a lost rank: where this one waited, before the group ends
        if cfg.dist.flight_recorder and cfg.output_dir and env.world_size > 1:
            folder = Path(cfg.output_dir) / "flight_recorder"
            flight.dump_after_failure(e, folder, env.rank, env.backend)
        raise
    finally:
        pg.shutdown()
