"""From a run's plan to training: check the host, then train here or hand the run to
torchrun's agent (launch.py), and report where the result went."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from paratrain.checkpoint import room
from paratrain.config import to_yaml
from paratrain.data import images
from paratrain.errors import ERROR_DIR, UserError
from paratrain.launch import job, preload, procs, runfolder
from paratrain.launch import torchrun as launch
from paratrain.launch.runfolder import restarted
from paratrain.runplan import RunPlan, cpu
from paratrain.tasks import get_task
from paratrain.trainer.loop import train
from paratrain.worker import forked


def preflight(plan: RunPlan, overwrite: bool = False) -> dict | None:
    """Checks that need this machine (GPUs, files): done once, before any process starts;
    then the run folder claimed (runfolder.claim: no earlier run there, or overwrite) -> what
    --overwrite set aside, for settled()."""
    cfg = plan.config
    check_devices(plan)
    if plan.multiprocess:
        launch.check_numa_affinity(cfg.launch, plan.device == "cuda")
    get_task(plan.task).preflight(cfg, plan.layout, plan.device == "cuda")
    if cfg.log.wandb and importlib.util.find_spec("wandb") is None:
        raise UserError("log.wandb: the wandb package is not installed (pip install wandb)")
    return check_folders(cfg, overwrite)


def check_devices(plan: RunPlan) -> None:
    cfg, cuda = plan.config, plan.device == "cuda"
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "device: cuda was asked for but no GPU is visible (check CUDA_VISIBLE_DEVICES)"
        )
    if not cuda and cfg.precision == "tf32":  # device=auto on a machine without a GPU
        raise UserError(
            "precision: tf32 is a CUDA tensor-core mode and no GPU is in use; use fp32 or bf16"
        )
    if cuda and plan.multiprocess and plan.nproc > torch.cuda.device_count():
        raise UserError(
            f"launch.nproc: {plan.nproc} processes but {torch.cuda.device_count()} GPUs visible; "
            "use at most one process per GPU, or device=cpu"
        )


def check_folders(cfg, overwrite: bool = False) -> dict | None:
    if cfg.output_dir:
        writable_folder(cfg.output_dir, "output_dir")
        runfolder.check_checkpoint_dir(cfg)
    if cfg.checkpoint.dir:
        writable_folder(cfg.checkpoint.dir, "checkpoint.dir")
    resume = cfg.checkpoint.resume
    if overwrite and resume:
        raise UserError(
            f"--overwrite: replaces the run in {cfg.output_dir}, checkpoint.resume ({resume}) "
            "continues one; give one of them"
        )
    if resume and resume != "auto" and not Path(resume).exists():  # before any process starts
        raise UserError(f"checkpoint.resume: {resume} does not exist")
    if resume and cfg.output_dir and room.writes(cfg.checkpoint):
        # the run's checkpoints/, maybe a read-only copy; room for one as big as the resumed
        folder = runfolder.checkpoint_dir(cfg, Path(cfg.output_dir))
        writable_folder(str(folder), "checkpoint.dir")
        room.preflight(cfg.checkpoint, folder)
    # checkpoint.resume=auto with nothing to resume starts a fresh run: refused as one where an
    # earlier run is (its files would be replaced, TensorBoard would hold both)
    fresh = not resume or (resume == "auto" and not _own_checkpoints(cfg))
    if cfg.output_dir and not restarted():
        runfolder.recover(Path(cfg.output_dir))  # a replacement a killed command left undone
    if cfg.output_dir and fresh and not restarted():  # last: overwrite moves files
        return runfolder.claim(cfg, overwrite)
    return None


def _own_checkpoints(cfg) -> bool:
    from paratrain.checkpoint import list_checkpoints

    folder = runfolder.checkpoint_dir(cfg, Path(cfg.output_dir)) if cfg.output_dir else None
    return bool(folder and list_checkpoints(folder))


def writable_folder(path: str, key: str) -> None:
    """A folder the run may create and write into: not a file, under a writable folder."""
    p = Path(path).absolute()
    if p.exists() and not p.is_dir():
        raise UserError(f"{key}: {path} is a file; give a folder")
    ancestor = next(a for a in (p, *p.parents) if a.exists())
    if not ancestor.is_dir():
        raise UserError(f"{key}: {path} lies under the file {ancestor}; give a folder")
    # a real try, not os.access: root passes os.access on /proc or a read-only mount
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".paratrain-probe-", dir=ancestor))
    except OSError as e:
        raise UserError(f"{key}: cannot write into {ancestor} ({e.strerror})") from None


def _forkable_main() -> bool:
    """A fork server's children import the launching process's __main__ (multiprocessing's
    spawn preparation). Harmless where that is paratrain's own entry point, pytest's, or
    nothing (a notebook, python -c); a user's script calling paratrain.train would run again
    in every worker, so its workers start as `python -m paratrain.worker` instead."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if name.split(".")[0] in ("paratrain", "pytest", "xdist"):
        return True
    path = getattr(main, "__file__", None)
    return path is None or Path(path).name in ("paratrain", "pytest", "py.test")


def worker_imports(plan: RunPlan) -> tuple[str, ...]:
    """What a worker imports before it trains, for the agent's fork server to import once."""
    # PARATRAIN_FORKSERVER=0: one `python -m paratrain.worker` per rank, as torchrun alone
    # starts them; =1 forks on GPUs too (there the workers' imports are a small part of a run).
    switch = os.environ.get("PARATRAIN_FORKSERVER", "")
    if switch == "0" or not _forkable_main():
        return ()
    if switch != "1" and plan.device == "cuda":
        return ()
    # torch's compiler config (dynamo and inductor, ~1.2 s of CPU): every worker reads it,
    # through DDP's optimize_ddp switch or the compile options' check, compiled or not.
    compiler = ("torch._inductor.config",)
    # the third-party libraries this run's task, model and data import (none for custom)
    libraries = get_task(plan.task).imports(plan.config)
    return ("paratrain.worker", "paratrain.trainer.trainer", *compiler, *libraries)


def with_output_dir(plan: RunPlan) -> RunPlan:
    """The plan with its run folder named (runs/<name>-<time> unless the config names one)."""
    import dataclasses

    if plan.config.output_dir:
        return plan
    cfg = dataclasses.replace(plan.config, output_dir=runfolder.output_dir(plan.config))
    writable_folder(cfg.output_dir, "output_dir")  # runs/ under a folder this user may not write
    return dataclasses.replace(plan, config=cfg)


def execute(plan: RunPlan, overwrite: bool = False) -> int:
    """The run `plan` describes, from the command line or paratrain.train; overwrite: a run
    already in its folder is replaced (--overwrite), else refused."""
    slurm = None if launch.launched_by_torchrun() else launch.slurm_rank_env()
    if slurm:
        os.environ.update(slurm)
    if launch.launched_by_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        if not plan.multiprocess and world > 1:
            raise UserError(
                f"strategy: {plan.strategy} runs in one process but this job has {world}; "
                "use ddp-ds"
            )
        if int(os.environ.get("RANK", "0")) != 0:
            train(plan)
            return 0
        with settled(plan, preflight(plan, overwrite)):
            train(plan)
        return 0
    plan = with_output_dir(plan)  # named here: checked as a folder given would be
    # a CPU run's memory against this machine's: a note, or refused before anything is claimed
    plan = plan if plan.multiprocess else cpu.judged(plan)  # a launch's: its workers judge
    made = runfolder.made_for(Path(plan.config.output_dir))
    set_aside = preflight(plan, overwrite)
    try:
        with settled(plan, set_aside) as outcome:
            if plan.multiprocess:
                outcome.code = launch_workers(plan)
            else:
                train(plan)
        return outcome.code
    finally:  # a mistake found before the first step: no folder left that the launch made
        runfolder.remove_if_empty(made)


class _Outcome:
    code = 0


@contextlib.contextmanager
def settled(plan: RunPlan, set_aside: dict | None):
    """The run's end in the command that launched it, however it ends: its ledger's last look,
    and what this command's --overwrite set aside (`set_aside`) removed after a success or put
    back after a failure (runfolder.settle)."""
    outcome = _Outcome()
    succeeded = False
    try:
        yield outcome
        succeeded = outcome.code == 0
    finally:
        if plan.config.output_dir:
            runfolder.settle(Path(plan.config.output_dir), succeeded, set_aside)


def rendezvous_error(e: BaseException) -> bool:
    """The agent lost its connection to the rendezvous's store (RendezvousConnectionError, over
    c10d's DistNetworkError): its host went away. Not a rendezvous that timed out or that
    another node closed: those say what they are as they are."""
    from torch.distributed import DistNetworkError
    from torch.distributed.elastic.rendezvous import RendezvousConnectionError

    chain = [e, e.__cause__, e.__context__]
    return any(isinstance(x, (RendezvousConnectionError, DistNetworkError)) for x in chain if x)


def launch_workers(plan: RunPlan) -> int:
    """The plan to torchrun's agent, which starts one worker per process on this node; how
    they ended, said once (job.py)."""
    cfg = plan.config
    # The workers read the plan from a folder of this launch's own: the run folder's
    # config.yaml and plan.json are written by rank 0 once the run's checks have passed (a
    # refused resume or a folder of another run must leave them as they were).
    with tempfile.TemporaryDirectory(prefix="paratrain-launch-") as launch_dir:
        plan_path = Path(launch_dir) / "plan.json"
        plan.save(plan_path)
        (Path(launch_dir) / "config.yaml").write_text(to_yaml(cfg))
        argv = launch.torchrun_argv(cfg.launch, plan.nproc, plan_path, agent_signals=False)
        print(f"paratrain: torchrun {' '.join(argv)}", flush=True)
        errors = Path(launch_dir) / "errors"
        errors.mkdir()
        os.environ[ERROR_DIR] = str(errors)  # the workers inherit it
        images.hand_down(Path(launch_dir))  # preflight's image check: not read again per rank
        signals_before = os.environ.get("TORCHELASTIC_SIGNALS_TO_HANDLE")
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = launch.AGENT_SIGNALS
        # the workers' thread count, set here (torchrun would set 1 and print a banner); this
        # process's own value back afterwards (a notebook's next run reads it)
        threads_before = os.environ.get("OMP_NUM_THREADS")
        os.environ["OMP_NUM_THREADS"] = str(launch.threads_per_process(cfg.launch, plan.nproc))
        ooms = procs.oom_kills()  # (a SIGKILL's author: the OOM killer if this count rises)
        saved = job.saved_before(cfg.output_dir)  # (another node's traceback: a new one)
        try:
            with (
                job.forwarded_signals(errors),
                launch.quiet_agent(),
                # none of the launch's processes outlives it (its workers' loader workers too)
                procs.none_outlive(f"{ERROR_DIR}={errors}"),
                preload.guarded(worker_imports(plan)) as names,
            ):
                launch.run_torchrun(argv, preload=names, entrypoint=forked)
        except ChildFailedError as e:
            return job.outcome(errors, cfg.output_dir, job.exits_of(e), ooms)
        except Exception as e:  # the agent's own failure (rendezvous, a port in use, ...)
            if cfg.launch.rdzv_endpoint and rendezvous_error(e):  # (not one node's standalone)
                code = job.lost_rendezvous(
                    errors, cfg.output_dir, cfg.launch.rdzv_endpoint, saved, e, ooms
                )
                if code is not None:
                    return code
                print(job.unreached(cfg.launch.rdzv_endpoint, e), file=sys.stderr)
                return 1
            print(f"paratrain: torchrun failed: {type(e).__name__}: {e}", file=sys.stderr)
            return 1
        finally:
            os.environ.pop(ERROR_DIR, None)
            os.environ.pop(images.HANDED, None)
            os.environ.pop("TORCHELASTIC_SIGNALS_TO_HANDLE", None)
            if signals_before is not None:
                os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = signals_before
            os.environ.pop("OMP_NUM_THREADS", None)
            if threads_before is not None:
                os.environ["OMP_NUM_THREADS"] = threads_before
        job.check_interrupted(errors)
    return 0
