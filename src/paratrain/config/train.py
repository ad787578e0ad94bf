"""train.*, log.*, scaler.*, checkpoint.*: the loop's own settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Precision = Literal["fp64", "fp32", "tf32", "fp16", "bf16"]


@dataclass(kw_only=True)
class TrainConfig:
    epochs: int = 1
    """Passes over the training set (each rank's share of it, for ddp-rr / ddp-ds)."""
    max_steps: int | None = None
    """Run exactly this many optimizer steps (as many epochs as that takes), whatever epochs says."""
    optimizer: Literal["sgd", "adamw", "adamw8bit", "adamw4bit", "adamw-fp8"] = "adamw"
    """sgd (with momentum) or adamw; adamw8bit / adamw4bit / adamw-fp8: AdamW with its two
    states held in 8 bits, 4 bits or float8 (torchao.optim: block-wise scaled, 2 / 1 / 2 bytes
    per parameter instead of 8), what lets a large model's full training fit on fewer GPUs."""
    fused_optimizer: bool | Literal["auto"] = "auto"
    """The optimizer's fused implementation (one kernel per parameter group and step, fewer
    launches) instead of PyTorch's default foreach one; same update. auto: fused on a GPU for
    sgd and adamw (runplan/levers.py)."""
    bf16_weights: bool | Literal["auto"] = "auto"
    """auto: on for a causal language model's full training in bf16 with adamw on a GPU with
    Triton (one process or DDP), else off. precision bf16 only: the model's trained weights held in bf16, their fp32 master copy in
    AdamW's state (Megatron-LM's and DeepSpeed's layout): no per-matmul casts of fp32 weights, a
    bf16 residual stream and bf16 gradients; one fused kernel a weight updates the master and
    rounds it into the weight (Triton on CUDA). adamw only; one process or DDP (the ranks'
    gradients summed in fp32; sync.mode every_step, ddp.gradient_compression none or bf16);
    not with LoRA, float8, FSDP, TP, pipelines or split."""
    lr: float = 1e-3
    """Learning rate (constant, or the peak of the cosine schedule)."""
    momentum: float = 0.9
    """SGD momentum."""
    adam_beta1: float = 0.9
    """AdamW's first-moment decay (DCGAN's recipe uses 0.5)."""
    adam_beta2: float = 0.999
    """AdamW's second-moment decay."""
    weight_decay: float = 0.0
    """Decoupled (adamw) or L2 (sgd) weight decay."""
    max_grad_norm: float | None = None
    """Clip the gradients to this global L2 norm before each update (torch's clip_grad_norm_
    over every rank's shards); null: no clipping. Not with a pipeline nor a task's own step."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """constant, or cosine decay to zero over the planned steps."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step; DDP all-reduces only on the last one (no_sync)."""
    activation_checkpointing: bool = False
    """Recompute the trunk's activations in backward instead of storing them (less memory, more time)."""
    channels_last: bool | Literal["auto"] = "auto"
    """NHWC memory layout for conv nets; faster with tensor cores on CUDA. auto: on for
    paratrain's and timm's image models on a GPU."""
    compile: bool | Literal["auto"] = "auto"
    """torch.compile the model before wrapping it for data parallelism. auto: on a GPU with
    Triton, for the tasks whose models compile (language models, image models; not a GAN's or
    your own module from Python), except pipeline stages."""
    compile_mode: Literal[
        "auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"
    ] = "auto"
    """torch.compile mode; reduce-overhead and max-autotune replay CUDA graphs (fewer launches).
    auto: reduce-overhead where the task's batches keep one shape and CUDA graphs were measured
    to pay (image models; LoRA on fixed-length rows), else default."""
    compile_scope: Literal["auto", "blocks", "decoder"] = "auto"
    """What one graph holds. auto: decoder for a causal language model's full training in one
    process on a GPU, else blocks. blocks: each repeated block compiled in place, as torchtitan does
    (the layers share one graph, compiled once), and a language model's final norm; decoder: a
    language model's whole decoder (embedding, every layer, final norm) as one graph, so
    inductor fuses across layer boundaries (one layer's residual add with the next one's norm),
    for a longer compile. decoder: one process (strategy single)."""
    compile_options: dict[str, Any] = field(default_factory=dict)
    """Inductor settings applied on top of compile_mode's own (torch._inductor.list_mode_options),
    e.g. coordinate_descent_tuning: true or triton.cudagraphs: true; unknown names are refused,
    and so is a string or list value (a command or path inductor would run: cpp.cxx) unless you
    trust the config's code (--trust-code)."""
    sdpa_backend: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"
    """Attention kernel scaled_dot_product_attention tries first (language models, sdpa); the
    others stay behind it as fallbacks. auto keeps PyTorch's order; cudnn is cuDNN's fused
    attention (Hopper)."""
    cudnn_benchmark: bool | Literal["auto"] = "auto"
    """Let cuDNN time its algorithms once per input shape and keep the fastest. auto: on for
    image models on a GPU (one image size), unless train.deterministic."""
    deterministic: bool = False
    """Deterministic kernels only (torch.use_deterministic_algorithms); for exact reproducibility."""
    warmup_steps: int = 5
    """Steps left out of throughput and step-time measurements (start-up, allocator, cuDNN autotune)."""
    gc_every_steps: int = 0
    """Run Python's garbage collector every N optimizer steps, on every rank at the same step,
    and not otherwise during the loop (torchtitan's gc_freq). Automatic collections fall at
    different steps on different ranks, and a rank paused in one holds up every rank at the next
    all-reduce. 0: Python's automatic collection."""
    floor: bool = False
    """At the end, time the matmuls and attention one step must do, each alone on this device
    (meters/floor.py), and print the step beside that floor (result.json summary.floor). Whole
    models (one process or DDP's replicas); causal LMs of Llama-style families."""
    profile_steps: int = 0
    """Profile this many steps right after warm-up (torch.profiler): profile.txt in the output
    folder, the top operators in result.json. Throughput is measured after them."""
    eval: bool = True
    """Measure held-out accuracy at the end of every epoch."""
    max_bad_steps: int = 3
    """A step whose loss or gradients hold NaN or inf is skipped (no update; the scaler's own
    skips under fp16 are not counted) and counted; after this many the run stops with one line
    naming the steps and the last checkpoint. -1: no check (saves one all-reduce of a flag and
    one host sync per step; with fused_optimizer the flag is judged on the device and the host
    does not wait for it)."""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs: must be >= 1, got {self.epochs}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps: must be >= 1 or null, got {self.max_steps}")
        if self.lr <= 0:
            raise ValueError(f"lr: must be > 0, got {self.lr}")
        if self.grad_accum_steps < 1:
            raise ValueError(f"grad_accum_steps: must be >= 1, got {self.grad_accum_steps}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.max_bad_steps < -1:
            raise ValueError(f"max_bad_steps: must be >= -1, got {self.max_bad_steps}")
        if self.gc_every_steps < 0:
            raise ValueError(f"gc_every_steps: must be >= 0, got {self.gc_every_steps}")
        if self.profile_steps < 0:
            raise ValueError(f"profile_steps: must be >= 0, got {self.profile_steps}")
        for key in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, key) < 1:
                raise ValueError(f"{key}: must be in [0, 1), got {getattr(self, key)}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm: must be > 0 or null, got {self.max_grad_norm}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay}")
        if self.compile_options:
            check_inductor_options(self.compile_options)

    def compile_kwargs(self, cuda_graphs: bool = True) -> dict[str, Any]:
        """torch.compile's keywords: its mode alone, or (torch.compile takes a mode or options,
        not both) the mode's own settings with compile_options over them. cuda_graphs=False:
        the same without CUDA graphs (for a unit re-run in backward, see parallel/apply.py)."""
        mode = "default" if self.compile_mode == "auto" else self.compile_mode  # not resolved
        if not self.compile_options and cuda_graphs:
            return {"mode": mode}
        from torch._inductor import list_mode_options

        options = {**list_mode_options(mode), **self.compile_options}
        if not cuda_graphs:
            options["triton.cudagraphs"] = False
        return {"options": options}


_TRUST_ENV = "PARATRAIN_TRUST_CODE"
"""paratrain.trust.TRUST_ENV (--trust-code), read here directly: config imports no part of
paratrain."""


def check_inductor_options(options: dict[str, Any]) -> None:
    """Each name must be one of torch._inductor.config's and its value of the setting's kind, so a
    typo fails at config time in one line rather than at the first compiled step. Values are
    numbers and true / false (the tuning knobs): a string or a list names a command or a path
    inductor runs or reads (cpp.cxx is the C++ compiler's command line), which a handed recipe
    or config.yaml may set only where the user trusts its code (--trust-code)."""
    import os

    from torch._inductor import config as inductor

    known = inductor.get_config_copy()
    trusted = os.environ.get(_TRUST_ENV) == "1"
    for name, value in options.items():
        if name not in known:
            raise ValueError(
                f"compile_options: {name!r} is not a torch._inductor.config setting "
                "(names as in torch._inductor.list_mode_options(), e.g. coordinate_descent_tuning)"
            )
        default = known[name]
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ValueError(f"compile_options: {name} takes true or false, got {value!r}")
        if isinstance(default, int) and not isinstance(default, bool) and type(value) is not int:
            raise ValueError(f"compile_options: {name} takes an integer, got {value!r}")
        if not (trusted or value is None or type(value) in (bool, int, float)):
            raise ValueError(
                f"compile_options: {name} is {repr(value)[:80]}; a setting other than a number "
                "or true / false may name a command or a path inductor runs, and is taken only "
                "when you trust the config's code: --trust-code (paratrain.train(..., "
                "trust_code=True))"
            )


@dataclass(kw_only=True)
class LogConfig:
    progress: bool = True
    """Rank 0 shows a progress bar with throughput and ETA."""
    every_steps: int | None = None
    """Refresh the loss shown on the bar, and write a point of the step log, every N steps
    (a point does not wait for the device: its values are read once their copies land);
    null: often enough for about 20 points a run, at most every 10 steps (so a short run
    still has a loss curve)."""
    steps: bool = True
    """The step log: <output_dir>/steps.jsonl (loss, lr, gradient norm, throughput, memory,
    loss scale every every_steps)."""
    tensorboard: bool = True
    """The same as TensorBoard events in <output_dir>/tensorboard/ (when the tensorboard package
    is installed)."""
    wandb: bool = False
    """The same to Weights & Biases too (pip install wandb; wandb's own login, or
    WANDB_MODE=offline to keep it in <output_dir>/wandb/): a run named after the run, its
    config the resolved config."""
    wandb_project: str = "paratrain"
    """The Weights & Biases project the runs go to."""

    def __post_init__(self) -> None:
        if self.every_steps is not None and self.every_steps < 1:
            raise ValueError(f"every_steps: must be >= 1, got {self.every_steps}")


@dataclass(kw_only=True)
class ScalerConfig:
    """torch.amp.GradScaler settings, used with precision=fp16 only."""

    init_scale: float = 65536.0
    """First loss scale (2**16, the seed's and PyTorch's default)."""
    growth_factor: float = 2.0
    """Scale multiplier after growth_interval steps without inf/NaN gradients."""
    backoff_factor: float = 0.5
    """Scale multiplier when a step's gradients hold inf/NaN (the step is skipped)."""
    growth_interval: int = 2000
    """Clean steps between two scale increases."""

    def __post_init__(self) -> None:
        if self.init_scale <= 0:
            raise ValueError(f"init_scale: must be > 0, got {self.init_scale}")
        if self.growth_factor <= 1:
            raise ValueError(f"growth_factor: must be > 1, got {self.growth_factor}")
        if not 0 < self.backoff_factor < 1:
            raise ValueError(f"backoff_factor: must be in (0, 1), got {self.backoff_factor}")
        if self.growth_interval < 1:
            raise ValueError(f"growth_interval: must be >= 1, got {self.growth_interval}")


@dataclass(kw_only=True)
class CheckpointConfig:
    every_steps: int = 0
    """Save every N optimizer steps; 0 saves only at the end."""
    at_end: bool = True
    """Save when the run finishes."""
    keep: int = 2
    """Checkpoints kept on disk of the run's line (its oldest removed first; never another
    run's, another line's, or the one just written); 0 keeps all."""
    dir: str | None = None
    """Where checkpoints go; default <output_dir>/checkpoints."""
    resume: str | None = None
    """Checkpoint folder (step_<N>), or a folder whose newest good checkpoint is taken, to
    continue from; `auto`: this run's own newest good checkpoint, or a fresh start when it has
    none (a restarted worker does this by itself). It may come from another layout (degrees,
    process count): the weights and optimizer state are resharded on load."""
    on_interrupt: bool = True
    """Ctrl-C or SIGTERM (a scheduler's notice before a kill): every rank stops at the next
    step boundary and, with this true, writes a checkpoint of that step first; the command
    says how to resume (`paratrain run --resume <run dir>`) and exits with 130. A second
    Ctrl-C stops at once."""
    async_mode: str = "none"
    """`none`: the step waits until the checkpoint is on disk. `async`: the step waits only for
    the state's copy to host memory; a thread writes it (DCP async_save) while training goes
    on, and the checkpoint appears (manifest, rename) when the write is done. One save in
    flight at a time: the next one, and the end of the run, wait for it. (Staging through
    pinned memory, DCP's DefaultStager, failed on torch 2.11 with a deepcopy KeyError; not
    offered.)"""

    def __post_init__(self) -> None:
        if self.async_mode not in ("none", "async"):
            raise ValueError(f"async_mode: none or async, got {self.async_mode!r}")
        if self.every_steps < 0:
            raise ValueError(f"every_steps: must be >= 0, got {self.every_steps}")
        if self.keep < 0:
            raise ValueError(f"keep: must be >= 0, got {self.keep}")
