"""Everything a run builds before its first step, in order: output folder, seeds, the mesh, the
task's workload (model and data), the pipeline cut or layer split, the parallelism applied from
outside the model, the pipeline schedule, optimizer, loss scaler and the resume."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from paratrain.distributed import process_group as pg
from paratrain.distributed.parallel_dims import ParallelDims
from paratrain.errors import UserError
from paratrain.parallel.apply import parallelize, step_context
from paratrain.parallel.ddp import average_buffers, bytes_per_element
from paratrain.parallel.pipeline import (
    Pipeline,
    build_schedule,
    cut_stage,
    tied_copies,
    tied_names,
)
from paratrain.parallel.slowlink import SlowLink
from paratrain.parallel.split import apply_split, split_devices
from paratrain.parallel.sync import build as build_sync
from paratrain.parallel.tp import split_by_kind
from paratrain.precision import build_policy, build_scaler
from paratrain.protocols import BuildContext, Workload, unwrap
from paratrain.tasks import get_task
from paratrain.trainer.checkpoint import (
    AsyncSaves,
    LoopState,
    list_checkpoints,
    load_checkpoint,
    read_replica,
    resolve_resume,
    save_checkpoint,
)
from paratrain.trainer.config import build_optimizer
from paratrain.trainer.measure import seed_all


def default_output_dir(name: str) -> str:
    return str(Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


@dataclass
class Run:
    """A built run: what the loop reads."""

    plan: Any
    """runplan.RunPlan: what was decided before any process started."""
    cfg: Any
    env: pg.DistEnv
    dims: ParallelDims
    work: Workload
    model: nn.Module
    """What the loop trains: this rank's stage, parallelized, compiled and wrapped."""
    eval_model: nn.Module
    """The same without DDP's wrapper (whose forward is a collective)."""
    pipe: Pipeline | None
    optimizer: Any
    """The optimizer; a list of them, one per part, for a task of several models."""
    scaler: Any
    policy: Any
    state: LoopState
    out_dir: Path
    ckpt_dir: Path
    loader_batch: int
    k: int
    steps_per_epoch: int
    total_steps: int
    wrapper: str | None
    split: dict | None
    step_context: Callable[[], contextlib.AbstractContextManager]
    params: list
    """The trainable parameters (the optimizer's)."""
    dtensor_params: list
    """Trainable DTensor weights under tensor parallelism (their gradients are summed over the
    tp ranks before each optimizer step), else empty."""
    parts: dict[str, nn.Module] = field(default_factory=dict)
    """Workload.parts as trained: each wrapped (DDP / FSDP / compiled) on its own; empty for a
    task of one model."""
    saves: AsyncSaves | None = None
    """checkpoint.async_mode: the save in flight."""
    sync: Any = None
    """How the data-parallel replicas agree (parallel/sync.py): every step, local SGD, DiLoCo,
    stale-1; it also counts the bytes this rank hands to the gradient collectives."""
    grad_norm: Any = None
    """The last step's gradient norm (a device tensor) where this rank holds whole gradients
    (one process, DDP), for the step log; None elsewhere."""
    checkpoint_stats: dict = field(
        default_factory=lambda: {"saves": 0, "blocking_s": 0.0, "end_wait_s": 0.0}
    )
    """Checkpoints written by this run, the time its steps waited for them, and (async) the
    time the end of the run waited for the last write."""

    @property
    def redundant(self) -> bool:
        """ddp-full: every data-parallel rank reads every sample."""
        return self.plan.redundant

    @property
    def partition(self) -> int:
        """How many ways an epoch's samples are divided: the data-parallel ranks, unless each
        reads them all."""
        return 1 if self.plan.layout.sampler == "full" else self.dims.dp_size

    @property
    def unique_per_step(self) -> int:
        return self.loader_batch * self.k * self.partition

    @property
    def processed_per_step(self) -> int:
        return self.loader_batch * self.k * self.dims.dp_size

    def sync_buffers(self) -> None:
        """ddp.broadcast_buffers=false: each rank's BatchNorm statistics drift apart during
        training; they are averaged over the data-parallel ranks whenever the model is
        evaluated or saved."""
        if isinstance(self.model, DistributedDataParallel) and not self.cfg.ddp.broadcast_buffers:
            average_buffers(self.model, self.model.process_group)

    @property
    def layout(self) -> dict[str, Any]:
        return {"degrees": self.dims.describe(), "label": self.dims.label()}

    def save(self) -> None:
        """Every N steps and at the end: the same state, the same files (collective)."""
        self.state.samples_in_epoch = self.state.step_in_epoch * self.k * self.loader_batch
        self.state.samples_in_epoch *= self.partition
        began = time.perf_counter()
        replica = self.replica()
        # DCP keeps one copy of each replicated tensor, from whichever rank its planner picks:
        # that copy is the replicas' mean, and each rank's own goes in its replica file
        with self.sync.one_model(unwrap(self.model)) if self.sync else contextlib.nullcontext():
            self._save(replica)
        self.checkpoint_stats["saves"] += 1
        self.checkpoint_stats["blocking_s"] += time.perf_counter() - began

    def _save(self, replica: dict | None) -> None:
        save_checkpoint(
            self.ckpt_dir,
            model=unwrap(self.model),
            optimizer=self.optimizer,
            scaler=self.scaler,
            state=self.state,
            device=self.env.device,
            keep=self.cfg.checkpoint.keep,
            layout=self.layout,
            saves=self.saves,
            replica=replica,
        )

    def replica(self) -> dict | None:
        """sync.mode local_sgd / diloco / stale: this rank's weights, optimizer and sync state,
        which DCP's one copy of replicated tensors would lose."""
        if self.sync is None or not self.sync.keeps_replicas:
            return None
        return {
            "model": {k: v.detach().clone() for k, v in unwrap(self.model).state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "sync": self.sync.state_dict(),
        }

    def finish_saves(self) -> None:
        """The end of the run: the checkpoint in flight is written and in place (collective)."""
        if self.saves is not None:
            began = time.perf_counter()
            self.saves.close()
            self.checkpoint_stats["end_wait_s"] += time.perf_counter() - began


def setup(plan, env: pg.DistEnv) -> Run:
    cfg = plan.config
    device, tc, uses = env.device, cfg.train, plan.layout.uses
    out_dir = Path(pg.broadcast_object(cfg.output_dir or default_output_dir(cfg.name)))
    ckpt_dir = checkpoint_dir(cfg, out_dir)
    if not restarted() and not cfg.checkpoint.resume:
        refuse_other_run(ckpt_dir)

    # ---- determinism and kernels
    seed_all(cfg.seed)  # same seed everywhere: identical initial weights on every rank
    # warn_only: a few ops have no deterministic CUDA kernel, among them adaptive average
    # pooling's backward, which every torchvision classifier has; they run with torch's warning
    # instead of stopping the run (the rest of the step stays deterministic).
    torch.use_deterministic_algorithms(tc.deterministic, warn_only=True)
    torch.backends.cudnn.benchmark = tc.cudnn_benchmark and not tc.deterministic

    # ---- the mesh: the only place degrees become process groups
    if plan.world_size != env.world_size:
        raise UserError(
            f"launch.nproc: the plan is for {plan.world_size} processes, this job has "
            f"{env.world_size}"
        )
    dims = ParallelDims(**plan.degrees, device_type=device.type, tp_named="tp" in uses)
    wrapper = plan.layout.wrapper

    # ---- the workload: model and data (dp scatters one loader batch over all GPUs)
    dp_gpus = torch.cuda.device_count() if ("dp" in uses and device.type == "cuda") else 1
    loader_batch = cfg.data.batch_size * dp_gpus
    policy = build_policy(cfg.precision, device)
    work = get_task(plan.task).build(
        BuildContext(
            cfg=cfg,
            layout=plan.layout,
            device=device,
            is_main=env.is_main,
            dp_rank=dims.dp_rank,
            dp_size=dims.dp_size,
            policy=policy,
            loader_batch=loader_batch,
            # a forward that is a collective needs the same held-out batch count everywhere
            even_val=wrapper == "fsdp" or dims.tp_enabled,
        )
    )
    work.out_dir = out_dir
    built = {**parameter_counts(work.model), "rows": work.rows}

    # ---- model parallelism that moves or cuts the model comes first
    model, split, stage_modules, tied = work.model, None, None, []
    shards = dims.tp if cfg.parallel.sequence_parallel else 1
    if "pp" in uses:  # this rank keeps its stage(s)
        tied = tied_names(model)  # of the whole model: a stage holds one of the names
        stage_modules = cut_stage(
            model,
            work.spec,
            dims,
            cfg.pipeline,
            channels_last=tc.channels_last,
            sequence_shards=shards,
        )
    if "split" in uses:  # this process puts consecutive units on consecutive GPUs
        devices = split_devices(cfg.split, device)
        split = apply_split(model, work.spec, devices, cfg.split.boundaries)

    # sync.simulated_gbps: the gradient / parameter collectives as if over a slow link
    link = (
        SlowLink(cfg.sync.simulated_gbps)
        if cfg.sync.simulated_gbps and env.world_size > 1
        else None
    )
    if link is not None and device.type == "cuda":
        raise UserError(
            "sync.simulated_gbps: a simulation for CPU processes (its delayed futures carry no "
            "CUDA stream order); use device=cpu, or a real link"
        )

    # ---- applied from outside the model, in a fixed order (parallel/apply.py)
    def apply(module: nn.Module, compile_units, stages=None) -> tuple[nn.Module, nn.Module]:
        return parallelize(
            module,
            work.spec,
            dims,
            wrapper=wrapper,
            device=device,
            policy=policy,
            train=tc,
            ddp=cfg.ddp,
            parallel=cfg.parallel,
            lora=plan.task == "causal_lm" and cfg.lora.enabled,
            compile_units=compile_units,
            stage_modules=stages,
            link=link,
        )

    parts: dict[str, nn.Module] = {}
    if work.parts:  # several models (a GAN): each wrapped on its own; the container is saved
        parts = {name: apply(part, None)[0] for name, part in work.parts.items()}
        eval_model = model
    else:
        model, eval_model = apply(model, work.compile_units, stage_modules)
    pipe = None
    if dims.pp > 1:  # one stage: the (wrapped) model itself; interleaved: modules sharing it
        stages = [model] if len(stage_modules) == 1 else stage_modules
        copies = tied_copies(unwrap(model), tied, dims)
        pipe = build_schedule(stages, dims, device, cfg.pipeline, work.pipeline, copies)
    # from here, dropout and friends differ per data-parallel rank (a tp group shares a stream)
    seed_all(cfg.seed + dims.dp_rank)

    params = [p for p in unwrap(model).parameters() if p.requires_grad]  # LoRA: the adapters only
    if work.parts:  # one optimizer per part, in the parts' order
        optimizer = [
            build_optimizer([p for p in part.parameters() if p.requires_grad], tc)
            for part in work.parts.values()
        ]
    else:
        optimizer = build_optimizer(split_by_kind(params) if dims.tp_enabled else params, tc)
    scaler = build_scaler(cfg.precision, cfg.scaler, device)
    k = tc.grad_accum_steps
    steps_per_epoch = len(work.train) // k
    if steps_per_epoch == 0:
        raise UserError(
            f"train.grad_accum_steps: {k} micro-batches exceed the {len(work.train)} of an epoch"
        )
    # max_steps, when set, decides the length alone (as many epochs as it takes).
    total_steps = tc.max_steps if tc.max_steps is not None else tc.epochs * steps_per_epoch

    run = Run(
        plan=plan,
        cfg=cfg,
        env=env,
        dims=dims,
        work=work,
        model=model,
        eval_model=eval_model,
        pipe=pipe,
        optimizer=optimizer,
        scaler=scaler,
        policy=policy,
        state=LoopState(),
        out_dir=out_dir,
        ckpt_dir=ckpt_dir,
        loader_batch=loader_batch,
        k=k,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        wrapper=wrapper,
        split=split,
        step_context=lambda: step_context(dims, cfg.parallel),
        params=params,
        dtensor_params=[p for p in params if hasattr(p, "placements")] if dims.tp_enabled else [],
        parts=parts,
        saves=AsyncSaves(cfg.checkpoint.async_mode),
        sync=build_sync(
            cfg.sync,
            params,
            bytes_per_element(cfg.ddp.gradient_compression, params[0].dtype)
            if wrapper == "ddp" and env.world_size > 1 and params
            else None,
            link=link,
        ),
    )
    # A restarted worker continues from its run's newest good checkpoint (before it has one,
    # from where the first generation started).
    start = resolve_resume("auto", ckpt_dir) if restarted() else None
    if start is None and cfg.checkpoint.resume:
        start = resolve_resume(cfg.checkpoint.resume, ckpt_dir)
    if start is not None:
        resume(run, start)
        if not restarted() and run.state.step >= total_steps:
            raise UserError(
                f"checkpoint.resume: {start} is at step {run.state.step}, where this run ends "
                f"({total_steps} steps): nothing to train; raise train.max_steps or "
                "train.epochs to go on"
            )
    # The run folder's config.yaml once every check has passed (a refused resume leaves an
    # earlier run's as it was); a restarted generation keeps what the first wrote.
    if env.is_main and not restarted():
        from paratrain.config import to_yaml
        from paratrain.runplan import show

        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(to_yaml(cfg))
        plan.save(out_dir / "plan.json", built)
        print(f"paratrain: plan ({out_dir / 'plan.json'})", flush=True)
        print("\n".join(show.lines(plan, built)), flush=True)
    if env.is_main and cfg.dist.flight_recorder and env.world_size > 1:
        (out_dir / "flight_recorder").mkdir(parents=True, exist_ok=True)  # NCCL dumps here
    return run


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Parameters and trained parameters, for the plan (a lazy module's are not known yet)."""
    from torch.nn.parameter import is_lazy

    params = [p for p in model.parameters() if not is_lazy(p)]
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }


def restore_replica(run: Run, path: Path, writer: dict) -> str:
    """sync.mode's own replica for this rank, over what DCP loaded (rank 0's copy): with the
    same processes the run goes on bit for bit; else every rank starts from rank 0's."""
    if run.sync is None or not run.sync.keeps_replicas:
        return ""
    replica = (
        read_replica(path, run.env.rank) if writer.get("world_size") == run.env.world_size else None
    )
    if replica is None:
        run.sync.load_state_dict({})  # DiLoCo: the shared weights are the loaded ones
        return "; the replicas restart from rank 0's weights (no replica of this rank's kept)"
    with torch.no_grad():
        unwrap(run.model).load_state_dict(replica["model"])
    run.optimizer.load_state_dict(replica["optimizer"])
    run.sync.load_state_dict(replica["sync"])
    return ""


def restarted() -> bool:
    """This worker was started again by torchrun's agent after a failure (here or on another
    node)."""
    return pg.generation() > 0


def checkpoint_dir(cfg, out_dir: Path) -> Path:
    return Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else out_dir / "checkpoints"


def refuse_other_run(ckpt_dir: Path) -> None:
    """A fresh run must not start where another run's checkpoints are: it would mix with them
    (and keep=N would delete its own newest first)."""
    found = list_checkpoints(ckpt_dir)
    if found:
        raise UserError(
            f"output_dir: {ckpt_dir} holds another run's checkpoints (newest {found[-1].name}); "
            "continue it with checkpoint.resume=auto, or give this run a new output_dir"
        )


def resume(run: Run, path: Path) -> None:
    state, writer = load_checkpoint(
        path,
        model=unwrap(run.model),
        optimizer=run.optimizer,
        scaler=run.scaler,
        device=run.env.device,
        layout=run.layout,
        aliases=run.pipe.tied.aliases if run.pipe is not None and run.pipe.tied else None,
    )
    # The epoch's samples already trained on, in this layout's steps: the same position when
    # the layout is the same, the nearest step boundary before it when it is not.
    per_step = run.unique_per_step
    state.step_in_epoch = state.samples_in_epoch // per_step
    state.samples_in_epoch = state.step_in_epoch * per_step
    if run.cfg.train.max_steps is None:  # epochs decide the length: count steps in this layout's
        state.step = state.epoch * run.steps_per_epoch + state.step_in_epoch
    run.state = state
    note = restore_replica(run, path, writer)
    if writer.get("world_size") != run.env.world_size or writer.get("degrees") != (
        run.dims.describe()
    ):
        note += (
            f"; written by {writer.get('world_size')} processes ({writer.get('label', '?')}),"
            f" resharded to {run.dims.label()}; random streams restart"
        )
    if run.env.is_main:
        print(
            f"paratrain: resumed from {path} at step {state.step} (epoch {state.epoch}){note}",
            flush=True,
        )


def deterministic_env(cfg) -> None:
    if cfg.train.deterministic:
        # cuBLAS needs this before its first handle is made to be deterministic.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
