"""`paratrain comm`'s worker: collectives timed over sizes (collectives.py) with this machine's
facts, written as result.json and busbw.png, and the table printed by rank 0.

Each torchrun worker runs ``python -m paratrain.comm.worker CONFIG_JSON``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from paratrain.comm.collectives import CommConfig, measure_all
from paratrain.distributed import process_group as pdist
from paratrain.errors import exit_code
from paratrain.meters import metrics


def run(cfg: CommConfig) -> dict:
    """In a torchrun worker: every op over every size; rank 0 prints and writes result.json."""
    env = pdist.init_distributed(cfg.device, multiprocess=True)
    try:
        result = {
            **measure_all(cfg, env),
            "hardware": metrics.hardware(env.device, env.world_size),
            "commit": metrics.git_commit(),
        }
        if env.is_main:
            from paratrain.bench.plots import comm_plot

            metrics.write_json(Path(cfg.out_dir) / "result.json", result)
            comm_plot(result, Path(cfg.out_dir) / "busbw.png")
            print_table(result)
        return result
    finally:
        pdist.shutdown()


def print_table(result: dict) -> None:
    from rich.table import Table

    table = Table(
        title=f"{result['backend']}, {result['world_size']} ranks, {result['dtype']}, "
        f"median of {result['passes']} passes of {result['iters']} calls per size "
        "(slowest rank)"
    )
    for name in ("op", "size", "time µs", "min-max µs", "algbw GB/s", "busbw GB/s"):
        table.add_column(name, justify="left" if name == "op" else "right")
    for r in result["rows"]:
        table.add_row(
            r["op"],
            _human(r["bytes"]),
            f"{r['time_us']:,.1f}",
            f"{r['time_us_min']:,.1f}-{r['time_us_max']:,.1f}",
            f"{r['algbw_gbps']:,.2f}",
            f"{r['busbw_gbps']:,.2f}",
        )
    metrics.console().print(table)  # a pipe or a log: the table's rows whole, not wrapped at 80


def _human(nbytes: int) -> str:
    for unit, scale in (("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return str(nbytes)


def write_config(cfg: CommConfig) -> Path:
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.json"
    path.write_text(json.dumps(asdict(cfg), indent=2))
    return path


def processes(cfg: CommConfig, asked: int | None) -> int:
    """How many workers: asked, or one per GPU (2 on a CPU machine); one line if not
    possible here."""
    import torch

    from paratrain.errors import UserError
    from paratrain.launch.torchrun import default_nproc

    cuda = torch.cuda.is_available() and cfg.device != "cpu"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError("--device: cuda was asked for but no GPU is visible")
    nproc = asked or default_nproc(True)
    if nproc < 2:
        raise UserError(f"--nproc: a collective needs at least 2 processes, got {nproc}")
    if cuda and nproc > torch.cuda.device_count():
        raise UserError(
            f"--nproc: {nproc} processes but {torch.cuda.device_count()} GPUs visible; "
            "use at most one per GPU, or --device cpu"
        )
    return nproc


def launch_workers(cfg: CommConfig, nproc: int) -> None:
    """`nproc` workers of this module through torchrun's agent (the comm command, doctor)."""
    from paratrain.launch import torchrun as launch

    config = launch.LaunchConfig()
    argv = launch.torchrun_argv(config, nproc, write_config(cfg), "paratrain.comm.worker")
    # the workers' thread count, set here as `paratrain run` sets it: torchrun would set 1 and
    # print a banner about it; a value the user set stays
    given = os.environ.get("OMP_NUM_THREADS")
    if given is None:
        os.environ["OMP_NUM_THREADS"] = str(launch.threads_per_process(config, nproc))
    try:
        launch.run_torchrun(argv)
    finally:
        if given is None:
            os.environ.pop("OMP_NUM_THREADS", None)


def main(argv: list[str]) -> int:
    (config_path,) = argv
    return exit_code(lambda: run(CommConfig(**json.loads(Path(config_path).read_text()))))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
