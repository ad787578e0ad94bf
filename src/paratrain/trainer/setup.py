"""Everything a run builds before its first step, in order (setup): output folder, seeds, the
mesh, the task's workload (model and data), the pipeline cut or layer split, the parallelism
applied from outside the model, the pipeline schedule, optimizer and loss scaler. Each a small
function; the plan (runplan.RunPlan) has decided what each one does."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
from torch import nn

from paratrain.distributed import process_group as pg
from paratrain.distributed.parallel_dims import ParallelDims
from paratrain.errors import UserError
from paratrain.launch.runfolder import (
    checkpoint_dir,
    output_dir,
    refuse_other_run,
    restarted,
    start_ledger,
)
from paratrain.parallel.apply import (
    Compile,
    Decisions,
    Replication,
    Sharding,
    TensorParallel,
    parallelize,
    step_context,
    uses_loss_parallel,
)
from paratrain.parallel.ddp import broadcast_masters, wire_bytes
from paratrain.parallel.pipeline import (
    build_schedule,
    cut_stage,
    tied_copies,
    tied_names,
)
from paratrain.parallel.slowlink import SlowLink
from paratrain.parallel.split import apply_split, split_devices
from paratrain.parallel.sync import build as build_sync
from paratrain.parallel.tp import split_by_kind
from paratrain.protocols import BuildContext, Workload, unwrap
from paratrain.tasks import get_task
from paratrain.trainer.built import Built, Schedule
from paratrain.trainer.config import build_optimizer
from paratrain.trainer.measure import seed_all
from paratrain.trainer.precision import build_policy, build_scaler


def setup(plan, env: pg.DistEnv) -> tuple[Built, Schedule]:
    cfg, device = plan.config, env.device
    # named by the launching command; workers torchrun started directly name it each: rank 0's
    out_dir = Path(pg.broadcast_object(output_dir(cfg)))
    ckpt_dir = checkpoint_dir(cfg, out_dir)
    if not restarted() and not cfg.checkpoint.resume:
        refuse_other_run(ckpt_dir)
    determinism(cfg)
    dims = mesh(plan, env)
    # dp scatters one loader batch over all GPUs
    dp_gpus = (
        torch.cuda.device_count() if ("dp" in plan.layout.uses and device.type == "cuda") else 1
    )
    loader_batch = cfg.data.batch_size * dp_gpus
    policy = build_policy(cfg.precision, device)
    work = workload(plan, env, dims, policy, loader_batch, out_dir)
    materialise_lazy(work)
    counts = {**parameter_counts(work.model), "rows": work.rows}
    masters = bf16_weights(work, cfg.train)  # before anything wraps or compiles the model
    link = slow_link(cfg, env)
    model, eval_model, parts, pipe, split = lay_out(plan, env, dims, work, policy, link)
    if masters and plan.layout.wrapper == "ddp" and env.world_size > 1:
        broadcast_masters(masters)  # DDP broadcast the weights; their masters follow
    # from here, dropout and friends differ per data-parallel rank (a tp group shares a stream)
    seed_all(cfg.seed + dims.dp_rank)
    params = [p for p in unwrap(model).parameters() if p.requires_grad]  # LoRA: the adapters
    steps_per_epoch, total_steps = lengths(cfg.train, len(work.train))
    schedule = Schedule(
        loader_batch=loader_batch,
        k=cfg.train.grad_accum_steps,
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        partition=1 if plan.layout.sampler == "full" else dims.dp_size,
        dp_size=dims.dp_size,
    )
    wrapper = plan.layout.wrapper
    built = Built(
        plan=plan,
        cfg=cfg,
        env=env,
        dims=dims,
        work=work,
        model=model,
        eval_model=eval_model,
        pipe=pipe,
        optimizer=optimizers(work, params, dims, cfg.train, masters),
        scaler=build_scaler(cfg.precision, cfg.scaler, device),
        policy=policy,
        out_dir=out_dir,
        ckpt_dir=ckpt_dir,
        wrapper=wrapper,
        split=split,
        step_context=lambda: step_context(dims, cfg.parallel),
        params=params,
        dtensor_params=[p for p in params if hasattr(p, "placements")] if dims.tp_enabled else [],
        parts=parts,
        sync=build_sync(
            cfg.sync,
            params,
            wire_bytes(cfg.ddp, params[0].dtype, cfg.train.bf16_weights)
            if wrapper == "ddp" and env.world_size > 1 and params
            else None,
            link=link,
        ),
        counts=counts,
    )
    return built, schedule


def determinism(cfg) -> None:
    seed_all(cfg.seed)  # same seed everywhere: identical initial weights on every rank
    tc = cfg.train
    # warn_only: a few ops have no deterministic CUDA kernel, among them adaptive average
    # pooling's backward, which every torchvision classifier has; they run with torch's warning
    # instead of stopping the run (the rest of the step stays deterministic).
    torch.use_deterministic_algorithms(tc.deterministic, warn_only=True)
    torch.backends.cudnn.benchmark = tc.cudnn_benchmark and not tc.deterministic


def deterministic_env(cfg) -> None:
    if cfg.train.deterministic:
        # cuBLAS needs this before its first handle is made to be deterministic.
        import os

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def mesh(plan, env: pg.DistEnv) -> ParallelDims:
    """The plan's degrees on this job's processes: the only place they become a mesh."""
    if plan.world_size != env.world_size:
        raise UserError(
            f"launch.nproc: the plan is for {plan.world_size} processes, this job has "
            f"{env.world_size}"
        )
    # strategy=tp on one rank: a degenerate mesh that runs the DTensor code paths
    return ParallelDims(
        **plan.degrees, device_type=env.device.type, tp_named="tp" in plan.layout.uses
    )


def workload(
    plan, env: pg.DistEnv, dims: ParallelDims, policy, loader_batch: int, out_dir: Path
) -> Workload:
    """The task's model and data for this rank."""
    wrapper = plan.layout.wrapper
    return get_task(plan.task).build(
        BuildContext(
            cfg=plan.config,
            layout=plan.layout,
            device=env.device,
            is_main=env.is_main,
            dp_rank=dims.dp_rank,
            dp_size=dims.dp_size,
            policy=policy,
            loader_batch=loader_batch,
            # a forward that is a collective needs the same held-out batch count everywhere
            even_val=wrapper == "fsdp" or dims.tp_enabled,
            out_dir=out_dir,
        )
    )


def materialise_lazy(work: Workload) -> None:
    """A model with lazy modules (nn.LazyLinear, ...) gets its shapes from one forward of a
    real batch, what it will see, before anything wraps or cuts it: every rank draws the same
    initial weights (same seed, same shapes), as one process does."""
    from torch.nn.parameter import is_lazy

    if not any(is_lazy(p) for p in work.model.parameters()):
        return
    if work.parts:
        raise UserError("model: lazy modules in a task of several models are not supported")
    with torch.no_grad():
        work.loss(work.model, next(iter(work.train)))


def slow_link(cfg, env: pg.DistEnv) -> SlowLink | None:
    """sync.simulated_gbps: the gradient / parameter collectives as if over a slow link."""
    if not cfg.sync.simulated_gbps or env.world_size == 1:
        return None
    if env.device.type == "cuda":
        raise UserError(
            "sync.simulated_gbps: a simulation for CPU processes (its delayed futures carry no "
            "CUDA stream order); use device=cpu, or a real link"
        )
    return SlowLink(cfg.sync.simulated_gbps)


def lay_out(plan, env, dims, work: Workload, policy, link):
    """The model over this rank's devices: model parallelism that moves or cuts it first
    (pipeline stage, layer split), then parallelism applied from outside (parallel/apply.py),
    then the pipeline schedule -> (model, eval_model, parts, pipe, split)."""
    cfg, uses = plan.config, plan.layout.uses
    model, split, stage_modules, tied = work.model, None, None, []
    if "pp" in uses:  # this rank keeps its stage(s)
        tied = tied_names(model)  # of the whole model: a stage holds one of the names
        shards = dims.tp if cfg.parallel.sequence_parallel else 1
        stage_modules = cut_stage(
            model,
            work.spec,
            dims,
            cfg.pipeline,
            channels_last=cfg.train.channels_last,
            sequence_shards=shards,
        )
    if "split" in uses:  # this process puts consecutive units on consecutive GPUs
        split = apply_split(
            model, work.spec, split_devices(cfg.split, env.device), cfg.split.boundaries
        )

    decided = decisions(plan, env, dims, work, policy, link)

    def apply(module: nn.Module, compile_units, stages=None) -> tuple[nn.Module, nn.Module]:
        compiled = decided.compile and dataclasses.replace(decided.compile, units=compile_units)
        return parallelize(module, dataclasses.replace(decided, compile=compiled), stages)

    if work.parts:  # several models (a GAN): each wrapped on its own; the container is saved
        parts = {name: apply(part, None)[0] for name, part in work.parts.items()}
        return model, model, parts, None, split
    model, eval_model = apply(model, work.compile_units, stage_modules)
    if plan.layout.wrapper == "fsdp" and work.known_loss:
        quiet_view_warning(work.model)
    pipe = None
    if dims.pp > 1:  # one stage: the (wrapped) model itself; interleaved: modules sharing it
        stages = [model] if len(stage_modules) == 1 else stage_modules
        copies = tied_copies(unwrap(model), tied, dims)
        pipe = build_schedule(stages, dims, env.device, cfg.pipeline, work.pipeline, copies)
    return model, eval_model, {}, pipe, split


def decisions(plan, env, dims, work: Workload, policy, link) -> Decisions:
    """What parallelize applies, read off the plan once (parallel/apply.py's steps)."""
    cfg = plan.config
    tp = None
    if dims.tp_enabled:
        tp = TensorParallel(
            sequence_parallel=cfg.parallel.sequence_parallel,
            loss_parallel=uses_loss_parallel(dims, cfg.parallel),
            local_inputs=plan.task_spec.lora and cfg.lora.enabled,  # peft's layers: plain tensors
        )
    return Decisions(
        spec=work.spec,
        dims=dims,
        device=env.device,
        wrapper=plan.layout.wrapper,
        sync_batchnorm=cfg.model.sync_batchnorm,
        tp=tp,
        checkpoint=cfg.train.activation_checkpointing,
        compile=Compile(work.compile_units, cfg.train.compile_kwargs)
        if cfg.train.compile
        else None,
        sharding=Sharding(policy, cfg.parallel.cpu_offload),
        replication=Replication(cfg.ddp, link, fp32_sum=cfg.train.bf16_weights),
    )


def quiet_view_warning(root: nn.Module) -> None:
    """FSDP2 warns when a wrapped module returns a view (an in-place op on it would skip the
    all-gather). The root's output goes straight into a loss paratrain or torch wrote, which
    changes nothing in place: that one is left out (a block's, or one a user's own loss reads,
    is kept)."""
    import re
    import warnings

    cls = type(root).__name__  # fully_shard swapped it for FSDP<class> already
    name = re.escape(cls if cls.startswith("FSDP") else f"FSDP{cls}")
    warnings.filterwarnings("ignore", message=rf"FSDP2-wrapped module \({name}\) returned a view")


def bf16_weights(work: Workload, tc) -> dict | None:
    """train.bf16_weights: the model's trained weights made bf16 -> their fp32 masters for the
    optimizer (optim/master_adamw.py); None otherwise."""
    if not tc.bf16_weights:
        return None
    if work.parts:
        raise UserError("train.bf16_weights: one model's weights; this task trains several")
    from paratrain.optim.master_adamw import to_bf16_weights

    return to_bf16_weights(work.model)


def optimizers(work: Workload, params: list, dims: ParallelDims, tc, masters=None):
    """One optimizer; a task of several models (Workload.parts) gets one per part, in the
    parts' order; under TP the DTensor weights and plain ones in groups of their own."""
    if work.parts:
        return [
            build_optimizer([p for p in part.parameters() if p.requires_grad], tc)
            for part in work.parts.values()
        ]
    return build_optimizer(split_by_kind(params) if dims.tp_enabled else params, tc, masters)


def lengths(tc, micro_batches: int) -> tuple[int, int]:
    """-> (optimizer steps per epoch, steps of the run: train.max_steps when set, however many
    epochs it takes; else train.epochs)."""
    k = tc.grad_accum_steps
    steps_per_epoch = micro_batches // k
    if steps_per_epoch == 0:
        raise UserError(
            f"train.grad_accum_steps: {k} micro-batches exceed the {micro_batches} of an epoch"
        )
    total = tc.max_steps if tc.max_steps is not None else tc.epochs * steps_per_epoch
    return steps_per_epoch, total


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """Parameters and trained parameters, for the plan (a lazy module's are not known yet)."""
    from torch.nn.parameter import is_lazy

    params = [p for p in model.parameters() if not is_lazy(p)]
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in params if p.requires_grad),
    }


def announce(built: Built) -> None:
    """The plan's lines on rank 0's console, once every check has passed (a restarted
    generation's were printed by the first). Its files follow the run's first step
    (write_plan)."""
    env, out_dir = built.env, built.out_dir
    if env.is_main and not restarted():
        print(f"paratrain: plan (saved as {out_dir / 'plan.json'} after step 1)", flush=True)
        print("\n".join(built.plan.lines(built.counts)), flush=True)
    nccl = env.device.type == "cuda" and env.world_size > 1
    if env.is_main and built.cfg.dist.flight_recorder and nccl:
        # NCCL dumps here by itself when a collective times out, in the first step too (gloo's
        # dumps, the watchdog's, make the folder when they write); removed at the end if
        # nothing was dumped, and by the launching command if the run wrote nothing else
        (out_dir / "flight_recorder").mkdir(parents=True, exist_ok=True)


def write_plan(built: Built, run_id: str) -> None:
    """The run folder's config.yaml and plan.json, once the run's first step has run
    (trainer.py): a refused resume or a mistake found before it leaves an earlier run's as
    they were. A restarted generation keeps what the first wrote (writes them if it had not).
    First the ledger of the run's files (runfolder.start_ledger), so that they are listed."""
    out_dir = built.out_dir
    if built.env.is_main and (not restarted() or not (out_dir / "config.yaml").is_file()):
        from paratrain.config import to_yaml

        out_dir.mkdir(parents=True, exist_ok=True)
        start_ledger(out_dir, run_id, new_session=not restarted())
        # the folder the run went to: what `paratrain run --resume <run dir>` continues in
        cfg = dataclasses.replace(built.cfg, output_dir=str(out_dir))
        (out_dir / "config.yaml").write_text(to_yaml(cfg))
        built.plan.save(out_dir / "plan.json", built.counts)


def tidy(built: Built) -> None:
    """The end of a run (or its interruption): no empty flight_recorder folder left behind."""
    folder = built.out_dir / "flight_recorder"
    if built.env.is_main and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
