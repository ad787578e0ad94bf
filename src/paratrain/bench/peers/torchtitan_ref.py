"""torchtitan as a peer: the same full-training run as paratrain's config, trained by
torchtitan's own Trainer under its own launch (torchrun -m torchtitan.train, through
torchtitan_main). Its model shape and random-token rows come, for torchtitan 0.2, from
torchtitan_spec through its `--experimental.custom_import` hook; from 0.3 on, from the config
function torchtitan_v03.paratrain_run named by `--module/--config` (the installed version picks:
torchtitan_args.api). Its model, parallelize, compile, optimizer and loss are its own. This
process builds the command, runs it, reads torchtitan's log and writes result.json in the peers'
format, with MFU by paratrain's formula (torchtitan's own figure beside it) and, from 0.3 on,
the torchtitan options in effect (its defaults kept: CUDA graphs, attention, loss, ...).

    python -m paratrain.bench.peers.torchtitan_ref CONFIG_YAML OUT_DIR

torchtitan is not a dependency of paratrain: where it is not installed the peer is skipped
(exit 3). Tested against torchtitan 0.2.2 (torch 2.11 on the GPU machine); written for 0.3.0,
which needs torch 2.13 or later (refused before any work on an older one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from paratrain.bench.peers import common
from paratrain.bench.peers.hf_lora import add_tokens
from paratrain.bench.peers.torchtitan_args import (
    api,
    command_args,
    installed_version,
    measured,
    read_log,
    unsupported,
)
from paratrain.meters import metrics

TIMEOUT_S = 1800


def main() -> None:
    plan, out_dir = common.read_plan("torchtitan")
    cfg = plan.config
    version = installed_version()  # None where torchtitan is absent (skipped below)
    why = unsupported(cfg, version)
    if why:
        common.fail(f"torchtitan peer: {why}")
    common.require("torchtitan")
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = (out_dir / "config.yaml").resolve()
    if not config_path.is_file():  # bench writes it; a direct call may name another file
        config_path.write_text(Path(sys.argv[1]).read_text())
    nproc = plan.nproc
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "paratrain.bench.peers.torchtitan_main",
        *command_args(cfg, str((out_dir / "torchtitan").resolve()), version),
    ]
    losses_path = out_dir / "torchtitan_losses.json"
    options_path = out_dir / "torchtitan_options.json"
    env = dict(
        os.environ,
        PARATRAIN_TT_CONFIG=str(config_path),
        PARATRAIN_TT_LOSSES=str(losses_path.resolve()),
        PARATRAIN_TT_OPTIONS=str(options_path.resolve()),
        PYTHONUNBUFFERED="1",
    )
    log_path = out_dir / "torchtitan.log"
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        code = subprocess.call(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=TIMEOUT_S
        )
    text = log_path.read_text()
    if code != 0:
        tail = "\n".join(text.strip().splitlines()[-15:])
        print(tail, file=sys.stderr)
        common.fail(f"torchtitan exited {code} (log: {log_path})")
    summary = summarise(cfg, text, losses_path, nproc)
    extra = {"torchtitan": version, "torchtitan_api": api(version)}
    if options_path.is_file():  # 0.3 on: what torchtitan ran with that paratrain did not choose
        extra["torchtitan_options"] = json.loads(options_path.read_text())
    common.write_result(out_dir, "torchtitan", cfg, first_device(), nproc, summary, **extra)


def summarise(cfg, text: str, losses_path: Path, world: int) -> dict:
    """The peers' summary from torchtitan's log lines and its per-step losses."""
    rows = read_log(text)
    length, batch = cfg.data.max_length, cfg.data.batch_size
    window = measured(rows, cfg.train.warmup_steps, batch * length)
    tokens_per_s = window["tokens_per_s"] * world  # torchtitan's tps is per device
    losses = json.loads(losses_path.read_text()) if losses_path.is_file() else []
    summary = {
        "unique_samples_per_s": tokens_per_s / length,
        "step_time_s": batch * length * world / tokens_per_s,
        "measured_steps": window["measured_steps"],
        "optimizer_steps": rows[-1]["step"],
        "warmup_excluded": True,
        "peak_memory_bytes": int(max(r["memory_gib"] for r in rows) * 2**30),
        "peak_memory_kind": "reserved (torchtitan's log)",
        "train_loss": sum(losses) / len(losses) if losses else rows[-1]["loss"],
        "val_accuracy": None,
        "energy": None,
        "losses": losses,
        # its own figure, per log line (none under float8 from 0.3 on)
        "torchtitan_mfu": [r["mfu_pct"] / 100 if r["mfu_pct"] is not None else None for r in rows],
    }
    add_tokens(summary, length, batch * length * world)
    summary.update(paratrain_mfu(cfg, tokens_per_s / world))
    return summary


def paratrain_mfu(cfg, tokens_per_s_per_device: float) -> dict:
    """MFU by paratrain's own formula (CausalLMSpec.flops_per_token on the same shape, built on
    the meta device): the same numerator and peak as paratrain's rows."""
    from paratrain.models.causal_lm.build import building, model_class, shape_config
    from paratrain.models.causal_lm.spec import CausalLMSpec

    config = shape_config(cfg.model.shape, cfg.model.layers)
    with building(torch.float32, "meta"):
        model = model_class(config)(config)
    per_token = CausalLMSpec().flops_per_token(model, cfg.data.max_length, False)
    peak = metrics.peak_flops(first_device())
    achieved = per_token * tokens_per_s_per_device
    return {
        "mfu": achieved / peak if peak else None,
        "mfu_basis": {"model_flops_per_token": per_token, "peak_flops_bf16_dense": peak},
    }


def first_device() -> torch.device:
    """The device this process sees first: torchtitan's rank 0 trains on it."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


if __name__ == "__main__":
    main()
