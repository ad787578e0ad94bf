"""Hand a run to torch.distributed.run (torchrun's elastic agent), or run it here.

- Started by an outside torchrun: the environment already names RANK / WORLD_SIZE; run here.
- Inside a SLURM step with several tasks (srun): each task is a rank; map SLURM's variables to
  torch.distributed's and run here. Nothing is spawned again.
- Otherwise, for a multi-process strategy: build torchrun's arguments and call its agent, which
  starts one worker per process (``python -m paratrain.worker <plan.json>`` on GPUs; on the
  CPU forked from a fork server that imported the workers' modules once, torchrun's
  --start-method=forkserver), rendezvouses (standalone on one node, c10d across nodes) and
  restarts workers up to max_restarts times.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

from paratrain.config.launch import LaunchConfig
from paratrain.distributed.host import cores
from paratrain.launch import terminal


def launched_by_torchrun(env: dict[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return "TORCHELASTIC_RUN_ID" in env or all(
        k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    )


def slurm_rank_env(env: dict[str, str] | None = None) -> dict[str, str] | None:
    """torch.distributed variables for a SLURM step whose tasks are the ranks, else None."""
    env = os.environ if env is None else env
    if "SLURM_PROCID" not in env or int(env.get("SLURM_NTASKS", "1")) < 2:
        return None
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "localhost")
    return {
        "RANK": env["SLURM_PROCID"],
        "WORLD_SIZE": env["SLURM_NTASKS"],
        "LOCAL_RANK": env.get("SLURM_LOCALID", "0"),
        "LOCAL_WORLD_SIZE": env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0],
        "MASTER_ADDR": env.get("MASTER_ADDR") or first_slurm_host(nodelist),
        # A port derived from the job id keeps two jobs sharing a node apart.
        "MASTER_PORT": env.get("MASTER_PORT")
        or str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000),
    }


def first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list such as 'gpu[003-005,007],cpu01'."""
    try:  # scontrol knows every form of the syntax; use it when it is there
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True
        ).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.CalledProcessError):
        pass
    m = re.match(r"([^,\[]+)(?:\[(\d+)[^\]]*\])?", nodelist)
    assert m, nodelist
    return m.group(1) + (m.group(2) or "")


def default_nproc(strategy_multiprocess: bool) -> int:
    if not strategy_multiprocess:
        return 1
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def torchrun_argv(
    cfg: LaunchConfig,
    nproc: int,
    config_path: Path,
    module: str = "paratrain.worker",
    agent_signals: bool = True,
) -> list[str]:
    """torchrun's arguments. agent_signals=False: the agent leaves SIGINT / SIGTERM to this
    process (job.forwarded_signals asks the workers to stop at a step boundary), where its
    torchrun takes --signals-to-handle."""
    argv = [f"--nproc-per-node={nproc}", f"--max-restarts={cfg.max_restarts}"]
    if not agent_signals and _torchrun_takes("signals_to_handle"):
        argv.append(f"--signals-to-handle={AGENT_SIGNALS}")
    if cfg.numa_affinity != "off":
        argv.append(f"--numa-binding={cfg.numa_affinity}")
    if cfg.nnodes == 1 and not cfg.rdzv_endpoint:
        argv.append("--standalone")
    else:
        # no --node-rank: c10d's rendezvous numbers the nodes as they join and ignores it
        # (torchrun warns so on every node but the first)
        argv += [
            f"--nnodes={cfg.nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        ]
    return argv + ["-m", module, str(config_path)]


AGENT_SIGNALS = "SIGQUIT"
"""What torchrun's agent may handle when paratrain forwards SIGINT / SIGTERM / SIGHUP itself
(job.py: the agent would end the workers at once, with no checkpoint); older agents read it
from TORCHELASTIC_SIGNALS_TO_HANDLE alone."""


def _torchrun_takes(option: str) -> bool:
    from torch.distributed.run import get_args_parser

    return any(a.dest == option for a in get_args_parser()._actions)


NATIVE_LOG = "TORCH_CPP_LOG_LEVEL"


def quiet_native_log(verbose: bool) -> None:
    """The command's own process (the elastic agent, preflight) keeps torch's native log to
    FATAL: a node whose rendezvous host has gone, or that cannot reach it, would otherwise print
    c10d's retries and timeouts, each with a C++ stack of up to thirty frames, above the one
    line that says what happened (job.lost_rendezvous, job.unreached); what fails there raises
    as well, and the report says it. c10 reads
    the level once, as torch loads: so torch is loaded here with it set, and the variable is
    gone again before anything starts (workers, a sweep's runs keep the user's environment).
    Never over the user's own setting, under --verbose, or once torch is loaded."""
    if verbose or "torch" in sys.modules or NATIVE_LOG in os.environ:
        return
    os.environ[NATIVE_LOG] = "FATAL"
    try:
        import torch  # noqa: F401
    except Exception:  # noqa: BLE001 - a broken install is said where torch is next imported
        pass
    finally:
        del os.environ[NATIVE_LOG]


@contextlib.contextmanager
def quiet_agent():
    """torchrun's agent logs each worker's exit and each signal it sends; paratrain reports
    how the job ended itself (job.outcome). PARATRAIN_VERBOSE=1 (`paratrain run --verbose`)
    keeps the agent's lines."""
    if os.environ.get("PARATRAIN_VERBOSE") == "1":
        yield
        return
    names = ("torch.distributed.elastic", "torch.multiprocessing")
    # the agent's own modules set their loggers' levels themselves: each of them, not only
    # the parents
    known = [n for n in logging.root.manager.loggerDict if n.startswith(names)]
    logs = [logging.getLogger(n) for n in {*names, *known}]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for log, level in zip(logs, levels, strict=True):
            log.setLevel(level)


def check_numa_affinity(cfg: LaunchConfig, cuda: bool) -> None:
    """Before any process starts: the binding needs GPUs to bind near, and a torchrun that
    binds (torch >= 2.9)."""
    if cfg.numa_affinity == "off":
        return
    from paratrain.errors import UserError

    if not cuda:
        raise UserError(
            "launch.numa_affinity: binds each rank near its GPU and no GPU is in use; set it off"
        )
    from torch.distributed.run import get_args_parser

    if not any("--numa-binding" in a.option_strings for a in get_args_parser()._actions):
        import torch

        raise UserError(
            f"launch.numa_affinity: torch {torch.__version__}'s torchrun has no --numa-binding "
            "(torch >= 2.9 has); set it off, or bind with numactl"
        )


def threads_per_process(cfg: LaunchConfig, local_processes: int) -> int:
    """launch.cpu_threads; else OMP_NUM_THREADS where the environment sets it (the standard
    knob, a user's or an outside torchrun's, kept as PyTorch keeps it); else this machine's
    cores over the processes on it."""
    if cfg.cpu_threads:
        return cfg.cpu_threads
    given = os.environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) >= 1:
        return int(given)
    return max(1, cores() // max(local_processes, 1))


def _no_join_trace(record: logging.LogRecord) -> bool:
    exc = record.exc_info[1] if record.exc_info else None
    if exc is not None and type(exc).__name__ == "ProcessExitedException":
        record.exc_info, record.exc_text = None, None
    return True


SAFE_PATH = "PYTHONSAFEPATH"


@contextlib.contextmanager
def safe_path():
    """The workers' Python without the working directory first on sys.path (PYTHONSAFEPATH=1,
    Python 3.11+): the fork server starts as `python -c`, a worker as `python -m`, each of
    which would otherwise put it there, and a numpy.py or yaml.py in the folder the user runs
    from (a handed run folder's) would be imported in place of the library. A builder module
    of the user's is still found: models.resolve_builder appends the working directory, last.
    This process's own value back afterwards."""
    before = os.environ.get(SAFE_PATH)
    os.environ[SAFE_PATH] = "1"
    try:
        yield
    finally:
        os.environ.pop(SAFE_PATH, None)
        if before is not None:
            os.environ[SAFE_PATH] = before


TRACKER_WARNING = "ignore:resource_tracker:UserWarning"
"""A -W option for multiprocessing's resource tracker, which passes this process's
sys.warnoptions to itself when it starts: a worker killed with SIGKILL leaves the semaphores
its loader held, the tracker removes them at the end, and its warning ("There appear to be 22
leaked semaphore objects") says nothing the launch's report of the kill has not."""


def quiet_resource_tracker() -> None:
    import sys

    if TRACKER_WARNING not in sys.warnoptions:
        sys.warnoptions.append(TRACKER_WARNING)


def run_torchrun(argv: list[str], preload: tuple[str, ...] = (), entrypoint=None) -> None:
    """torchrun's own agent, in this process. With `preload` (the modules every worker
    imports), the agent forks its workers from a fork server that imported them once, instead
    of starting `python -m <module>` per worker: on a CPU machine the imports (torch,
    transformers, peft: ~13 s of CPU each) are most of a short run's time, paid once rather
    than once per rank. `entrypoint` is then the function each forked worker runs with the
    module's argument (worker.forked: the same as `python -m paratrain.worker`)."""
    from torch.distributed.run import config_from_args, get_args_parser
    from torch.distributed.run import run as elastic_run

    # NCCL variables the user set are inherited by the workers unchanged; we add none.
    if not preload:
        with safe_path():
            elastic_run(get_args_parser().parse_args(argv))
        return
    import multiprocessing
    import uuid

    from torch.distributed.launcher.api import elastic_launch

    if "--standalone" in argv:  # what torchrun's --standalone stands for
        argv = [a for a in argv if a != "--standalone"]
        argv = [
            "--rdzv-backend=c10d",
            "--rdzv-endpoint=localhost:0",
            f"--rdzv-id={uuid.uuid4()}",
        ] + argv
    args = get_args_parser().parse_args(["--start-method=forkserver", *argv])
    config, _, cmd_args = config_from_args(args)
    # A fork server of this launch's own: Python keeps one per process, and a second launch
    # (paratrain.train twice, a notebook) would fork from one holding the first launch's
    # stdout / stderr, environment and anything read at import (PARATRAIN_FAULTS).
    from multiprocessing import forkserver

    forkserver._forkserver._stop()
    multiprocessing.set_forkserver_preload(list(preload))
    quiet_resource_tracker()
    with terminal.hangup_ignored():  # a shell's SIGHUP to the job's group must not end them
        forkserver.ensure_running()
    # A worker that exits non-zero is logged by the agent as one line ("failed (exitcode: 2)
    # local_rank: 0 ..."), as for `python -m` workers; for a function's process the agent adds
    # the traceback of its own join, which says nothing about the worker: left out.
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_no_join_trace)

    try:
        with safe_path():
            elastic_launch(config=config, entrypoint=entrypoint)(cmd_args[-1])
    finally:
        # this launch's fork server ends with it (Python would keep it until this process
        # exits: a notebook's, a long-lived caller's)
        with contextlib.suppress(OSError):
            forkserver._forkserver._stop()
