"""Settings of different owners checked against each other, once the strategy is known: each
a ValueError naming the key, the value and the fix (resolve turns it into the one-line error)."""

from __future__ import annotations

from paratrain.protocols import Layout, Task
from paratrain.tasks import TASKS, get_task

# Where a layout the task refuses comes from, to name the key to change.
LAYOUT_KEYS = {"tp": "parallel.tp", "pp": "parallel.pp"}
LAYOUT_NAMES = {
    "single": "single",
    "dp": "dp",
    "ddp": "ddp-*",
    "fsdp": "fsdp",
    "tp": "tp",
    "pp": "pipeline",
    "split": "split",
}


def check_run(cfg, strategy: str, replicating: bool) -> None:
    """The cross-owner rules of a run. replicating: DDP runs the data-parallel axis."""
    check_ddp_options(cfg, strategy, replicating)
    p = cfg.parallel
    if p.cpu_offload and not (strategy == "fsdp" or p.dp_shard != 1):
        raise ValueError(
            f"parallel.cpu_offload: moves FSDP's shards to host memory; strategy "
            f"{strategy} has none (use strategy=fsdp, on one GPU too)"
        )
    named = strategy in ("fsdp", "tp", "pipeline")  # their axis takes the ranks
    sharded = named or p.dp_shard != 1 or p.tp != 1 or p.pp != 1
    if cfg.lora.save_merged and sharded:
        raise ValueError(
            "lora.save_merged: merging needs whole weights on one rank; use ddp-ds, or merge later"
        )


def check_device(cfg, device: str) -> None:
    """The settings against the device the config names: tf32 with device=cpu contradicts
    itself anywhere. With device=auto the machine decides, and a machine without a GPU is the
    launch's to refuse (runner.check_devices): a GPU recipe or sweep still loads, and plans, on
    a laptop."""
    if cfg.precision == "tf32" and cfg.device == "cpu":
        raise ValueError(
            "precision: tf32 is a CUDA tensor-core mode, got device=cpu; use fp32 or bf16"
        )


def check_stages(strategy: str, degrees: dict[str, int], world: int) -> None:
    """strategy=pipeline: a stage per process, two at least."""
    if strategy == "pipeline" and degrees["pp"] < 2:
        raise ValueError(
            "launch.nproc: strategy pipeline needs at least 2 processes (one per stage), got "
            f"{world}"
        )


def decoder_tasks() -> str:
    """The tasks whose models are decoder stacks (Task.decoder_levers), named in a refusal."""
    return ", ".join(name for name in TASKS if get_task(name).decoder_levers)


def image_tasks() -> str:
    """The tasks that take the image levers (Task.image_levers), named in a refusal."""
    return ", ".join(name for name in TASKS if get_task(name).image_levers)


def check_bf16_weights(cfg, uses: frozenset[str], task: Task) -> None:
    """train.bf16_weights: bf16 weights whose fp32 masters MasterAdamW keeps."""
    if not cfg.train.bf16_weights:
        return
    why = None
    if not task.decoder_levers:  # measured and tested for the language models' full training
        why = (
            f"full training of causal language models (task {decoder_tasks()}); this is task "
            f"{task.name}"
        )
    elif cfg.precision != "bf16":
        why = f"bf16 weights compute in bf16; got precision {cfg.precision} (use precision=bf16)"
    elif cfg.train.optimizer != "adamw":
        why = (
            f"the fp32 masters live in paratrain's AdamW; got train.optimizer {cfg.train.optimizer}"
        )
    elif cfg.lora.enabled:
        why = "LoRA's frozen base is bf16 already and its adapters are small; not with lora"
    elif getattr(cfg.model, "fp8", "none") != "none":
        why = f"float8 layers cast fp32 weights themselves; not with model.fp8 {cfg.model.fp8}"
    elif uses not in ({"single"}, {"ddp"}):
        why = (
            "one process or DDP: FSDP's mixed precision keeps fp32 shards and casts bf16 "
            "copies for compute itself, and tensor / pipeline parallelism are not covered "
            f"(this run uses {', '.join(sorted(uses))})"
        )
    elif uses == {"ddp"}:
        why = _bf16_weights_ddp(cfg)
    if why:
        raise ValueError(f"train.bf16_weights: {why}")


def _bf16_weights_ddp(cfg) -> str | None:
    """Under DDP the ranks' bf16 gradients are summed in fp32 (parallel/ddp.py); each rank's
    masters then take the same step. The other sync modes average the weights (which would
    leave the masters behind) or all-reduce the gradients themselves."""
    mode = cfg.sync.mode
    if mode in ("local_sgd", "diloco"):
        return (
            f"sync.mode {mode} averages the bf16 weights, not their fp32 masters; "
            "use sync.mode=every_step"
        )
    if mode != "every_step":
        return (
            f"sync.mode {mode} all-reduces the gradients itself, outside DDP's fp32 sum; "
            "use sync.mode=every_step"
        )
    if cfg.ddp.gradient_compression not in ("none", "bf16"):
        return (
            f"ddp.gradient_compression {cfg.ddp.gradient_compression} is not covered; none "
            "(the gradients summed in fp32) or bf16 (as they are: half the bytes)"
        )
    return None


def check_compile_scope(cfg, uses: frozenset[str], task: Task) -> None:
    """train.compile_scope=decoder: one graph over a language model's whole decoder, in one
    process (FSDP shards each layer, TP and pipelines cut it, and under DDP dynamo splits a
    compiled graph at the gradient buckets, so it would not stay one graph)."""
    if cfg.train.compile_scope != "decoder":
        return
    why = None
    if not task.decoder_levers:
        why = (
            f"the decoder of a causal language model (task {decoder_tasks()}); this is task "
            f"{task.name}"
        )
    elif not cfg.train.compile:
        why = "it says what train.compile compiles; set train.compile=true with it"
    elif uses != {"single"}:
        why = (
            "one process (strategy single) for now: FSDP, tensor and pipeline parallelism work on "
            "the decoder's layers, and DDP splits a compiled graph at its gradient buckets (this "
            f"run uses {', '.join(sorted(uses))}); use compile_scope=blocks"
        )
    if why:
        raise ValueError(f"train.compile_scope: decoder: {why}")


def check_clipping(cfg, device: str) -> None:
    """train.max_grad_norm clips by the norm of every step's all-reduced gradients."""
    if cfg.train.max_grad_norm is None:
        return
    if cfg.sync.mode != "every_step":
        raise ValueError(
            f"train.max_grad_norm: sync.mode {cfg.sync.mode} applies gradients that were not "
            "all-reduced this step; clipping needs sync.mode=every_step"
        )
    if cfg.parallel.cpu_offload and device != "cpu":
        raise ValueError(
            "train.max_grad_norm: with parallel.cpu_offload the gradient shards live in host "
            "memory, which NCCL cannot reduce; not clipped yet"
        )


def check_ddp_options(cfg, strategy: str, replicating: bool) -> None:
    """Gradient compression and the sync modes act on DDP's all-reduce."""
    compression, sync = cfg.ddp.gradient_compression, cfg.sync
    if compression != "none" and not replicating:
        raise ValueError(
            f"ddp.gradient_compression: compresses DDP's all-reduce; strategy "
            f"{strategy} has none (use ddp-ds, ddp-rr or ddp-full)"
        )
    if sync.mode != "every_step":
        check_sync_mode(cfg, strategy, replicating)
    if sync.simulated_gbps:
        if not replicating:
            raise ValueError(
                f"sync.simulated_gbps: delays DDP's gradient collectives; strategy "
                f"{strategy} has none (use ddp-ds or ddp-rr)"
            )
        if compression == "powersgd":
            raise ValueError(
                "sync.simulated_gbps: PowerSGD's bytes are not counted, so no delay can be "
                "derived from them; use none, fp16, bf16 or int8"
            )


def check_sync_mode(cfg, strategy: str, replicating: bool) -> None:
    mode = cfg.sync.mode
    if not replicating or strategy == "ddp-full":
        raise ValueError(
            f"sync.mode: {mode} changes how DDP's replicas agree; strategy "
            f"{strategy} has none that train apart (use ddp-ds or ddp-rr)"
        )
    if cfg.precision == "fp16":
        raise ValueError(
            f"sync.mode: {mode} keeps gradients off DDP's all-reduce, so each "
            "rank's fp16 loss scale would drift on its own (and stale-1 would apply "
            "gradients scaled by an older one); use bf16 or fp32"
        )
    if mode == "stale" and cfg.ddp.gradient_compression != "none":
        raise ValueError(
            "sync.mode: stale runs its own fp32 all-reduce, which "
            "ddp.gradient_compression does not compress; set one of them"
        )


def check_pipeline(cfg) -> None:
    """What a pipeline does not do (yet): one line each, before anything runs."""
    if cfg.train.max_grad_norm is not None:
        raise ValueError(
            "train.max_grad_norm: a pipeline's stages hold parts of the norm; not clipped yet"
        )
    mb = cfg.pipeline.microbatches
    if cfg.train.compile is True:  # auto leaves pipeline stages eager
        raise ValueError(
            "train.compile: not with strategy=pipeline yet (parallel.pp > 1); set it false"
        )
    if cfg.precision == "fp16":
        raise ValueError(
            "precision: fp16's loss scaling is not wired through pipeline stages; use bf16"
        )
    if cfg.train.grad_accum_steps > 1:
        raise ValueError(
            "train.grad_accum_steps: a pipeline accumulates over its micro-batches already; "
            "set pipeline.microbatches instead"
        )
    if cfg.data.batch_size % mb:
        raise ValueError(
            f"pipeline.microbatches: data.batch_size {cfg.data.batch_size} does not divide "
            f"into {mb} equal micro-batches"
        )


def check_interleaved(cfg, pp: int, task: Task) -> None:
    """An interleaved schedule's needs, before launch: a model the task cuts by its layers (a
    language model's decoder layers), and micro-batches in whole rounds over the pipeline
    ranks."""
    p = cfg.pipeline
    if pp < 2 or not p.schedule.startswith("interleaved"):
        return
    if task.model_keys != "huggingface":
        raise ValueError(
            "pipeline.schedule: interleaved stages are built for language models; an image "
            "model's pipeline runs gpipe or 1f1b"
        )
    if p.microbatches % pp:
        raise ValueError(
            f"pipeline.microbatches: the interleaved schedule takes a multiple of the {pp} "
            f"pipeline ranks, got {p.microbatches}"
        )


def check_supported(task: Task, layout: Layout, strategy: str, precision: str) -> None:
    """The task trains with the layouts and precisions it declares; the rest are refused."""
    refused = sorted(layout.uses - task.layouts)
    if refused:
        kind = refused[0]
        key = LAYOUT_KEYS.get(kind, "strategy") if LAYOUT_NAMES[kind] != strategy else "strategy"
        offered = ", ".join(LAYOUT_NAMES[x] for x in LAYOUT_NAMES if x in task.layouts)
        why = task.refusals.get(kind) or (
            f"task {task.name} does not train with {LAYOUT_NAMES[kind]}; it trains with {offered}"
        )
        raise ValueError(f"{key}: {why}")
    if precision not in task.precisions:
        raise ValueError(
            f"precision: task {task.name} does not train in {precision}; it takes "
            f"{', '.join(sorted(task.precisions))}"
        )


# Settings that switch on what only one kind of model has: on a task that does not read them
# the run would not be what was asked, so they are refused: key -> (whether a value switches it
# on, what it is for, the value that asks for nothing).
SWITCHES = {
    "model.kernels": (
        lambda v: v not in ("auto", "none"),
        "a language model's kernels (Liger's layers, a fused cross-entropy over the vocabulary)",
        "none",
    ),
    "model.fp8": (lambda v: v != "none", "a language model's linear layers in float8", "none"),
    "model.fp8_lm_head": (lambda v: v is True, "a language model's lm_head in float8", "false"),
    "model.loss_chunk_tokens": (
        lambda v: v > 0,
        "a language model's lm_head and loss, a chunk of tokens at a time",
        "0",
    ),
    "model.depthwise_conv": (
        lambda v: v in ("shift-add", "triton"),
        "an image model's depthwise convolutions",
        "native",
    ),
    "model.stem_conv": (lambda v: v == "depthwise", "an image model's first convolution", "native"),
    "model.batchnorm": (lambda v: v == "triton", "an image model's BatchNorm layers", "native"),
    "model.sync_batchnorm": (
        lambda v: v is True,
        "an image model's BatchNorm statistics under DDP",
        "false",
    ),
    "train.channels_last": (
        lambda v: v is True,
        "the models and batches of task {image_tasks} (NHWC)",
        "false",
    ),
}


def unread_settings(cfg, task: Task) -> list[str]:
    """The settings this task does not read (its Task.unread; the image levers where it has
    none) that the config gives a value of its own: a value that switches on what this model
    does not have is refused (it can only be a mistake); any other (a size, a tokenizer, a
    section of another task's) is said in a note: it does nothing here. -> the notes."""
    import dataclasses

    from paratrain.config import RunConfig
    from paratrain.config.levers import PLAIN, get

    default = RunConfig()
    keys = [k for k in task.unread if "." in k]
    for section in (k for k in task.unread if "." not in k):
        keys += [f"{section}.{f.name}" for f in dataclasses.fields(get(cfg, section))]
    if not task.image_levers:
        keys.append("train.channels_last")
    notes = []
    for key in keys:
        value = get(cfg, key)
        if value == get(default, key) or (key in PLAIN and value == PLAIN[key]):
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key in SWITCHES and SWITCHES[key][0](value):
            _, what, off = SWITCHES[key]
            what = what.format(image_tasks=image_tasks())
            raise ValueError(
                f"{key}: {text} is for {what}; task {task.name} does not apply it, so it would "
                f"change nothing: set {key}={off} or drop it"
            )
        notes.append(f"{key}={text}: task {task.name} does not read it; it does nothing here")
    return notes


def check_sync_batchnorm(cfg, wrapper: str | None, device: str) -> None:
    if not cfg.model.sync_batchnorm:
        return
    if cfg.model.batchnorm != "native":
        raise ValueError(
            "model.sync_batchnorm: takes PyTorch's BatchNorm layers; model.batchnorm="
            f"{cfg.model.batchnorm} replaces them: set model.batchnorm=native"
        )
    if wrapper != "ddp":
        raise ValueError(
            "model.sync_batchnorm: converts BatchNorm for DDP's replicas; this run's "
            f"data-parallel wrapper is {wrapper or 'none'} (use ddp-ds, ddp-rr or ddp-full)"
        )
    if device != "cuda":
        raise ValueError(
            "model.sync_batchnorm: torch's SyncBatchNorm runs on GPUs (it has no CPU kernels); "
            "on the CPU each rank keeps its own batch statistics: set it false"
        )
