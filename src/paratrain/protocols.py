"""The shapes the parts of paratrain meet at: one small module every part may import.

- ModelSpec: what parallel/ may know of a model family (models/*/spec.py answer it).
- Task: what a task declares (the data it reads, the layouts and precisions it trains with)
  and the three functions it offers (check, preflight, build). tasks/*.py each define one.
- BuildContext: what a task's build gets: the config, the device, this rank's place among
  the data-parallel ranks, the precision policy; never the mesh or the trainer.
- Workload: what build returns: model, spec, loaders, loss, evaluation, pipeline hooks.
- StepContext: what a task of several models (the GAN) gets for its own optimizer step.
- PipelineHooks: how a pipeline's stages split a task's batch and score it.
- unwrap, whole_tensor: a module under its wrappers, a value computed on shards.

Nothing here imports a part of paratrain other than config/.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from paratrain.errors import UserError

# How a run lays its model over the ranks, as a task declares what it trains with:
LAYOUTS = ("single", "dp", "ddp", "fsdp", "tp", "pp", "split")
"""single: one device; dp: torch.nn.DataParallel; ddp: DistributedDataParallel replicas;
fsdp: FSDP2 (sharded, or replicated beside tp / pp); tp: tensor parallel; pp: pipeline stages;
split: consecutive blocks on consecutive GPUs of one process."""
PRECISIONS = ("fp64", "fp32", "tf32", "fp16", "bf16")


@dataclass(frozen=True)
class FamilyTraits:
    """What a model family allows beyond parallelism, declared on its spec (ModelSpec.traits):
    the plan, the levers and tune ask it through the task that trains it (Task.family)."""

    compiles: bool = True
    """Its models compile well enough for train.compile=auto to switch compile on (on a GPU
    with Triton); false: compiled only when asked (a GAN's two models, the user's own module)."""
    fp8: bool = False
    """model.fp8 / model.fp8_lm_head make its linear layers float8 (torchao): the plan, its
    hints and result.json name them."""
    decoder_levers: bool = False
    """The levers measured on a decoder stack apply: train.bf16_weights (fp32 masters in
    MasterAdamW), train.compile_scope=decoder (one graph over the decoder), and `paratrain
    tune` searches model.kernels, model.fp8 and model.loss_chunk_tokens."""
    image_levers: bool = False
    """The image models' levers apply: the Triton depthwise / BatchNorm layers (a note where no
    GPU runs them), channels_last, cudnn_benchmark, data.resize_on and the loader's workers
    (`paratrain tune` searches them; `paratrain doctor` times its loader alone)."""


class ModelSpec(Protocol):
    """What the parallel layer may know about a model family, and nothing more (models/spec.py
    says what each question means)."""

    family: str
    traits: FamilyTraits
    flops_formula: str | None  # what flops_per_token counts, quoted in result.json

    def blocks(self, model: nn.Module) -> list[nn.Module]: ...

    def pipeline_units(self, model: nn.Module) -> int: ...

    def make_stage(
        self, model: nn.Module, keep: range, stage: int, stages: int, **options: Any
    ) -> nn.Module: ...

    def make_stages(
        self, model: nn.Module, local: list[tuple[int, range]], stages: int, **options: Any
    ) -> list[nn.Module]: ...

    def split_units(self, model: nn.Module) -> list[nn.Module]: ...

    def tp_plan(self, model: nn.Module, **options: Any) -> dict[str, Any]: ...

    def flops_per_token(self, model: nn.Module, seq_len: int, lora: bool) -> float | None: ...


@dataclass(frozen=True)
class Layout:
    """How the run lays its model over the ranks (decided by runplan.resolve): what a task's
    checks may read. Degrees and the layouts in use, never a strategy name."""

    degrees: dict[str, int]
    """pp, dp_replicate, dp_shard, tp for this run's processes."""
    uses: frozenset[str]
    """The LAYOUTS this run combines ({"fsdp", "tp"}, {"single"}, ...)."""
    wrapper: str | None
    """The data-parallel wrapper: ddp, fsdp, data-parallel, or None."""
    sampler: str
    """How the data-parallel ranks share the data: distributed, round-robin, full."""
    stages_per_rank: int = 1
    """Pipeline stages each rank holds (interleaved schedules hold several)."""

    @property
    def tp(self) -> int:
        return self.degrees["tp"]

    @property
    def pp(self) -> int:
        return self.degrees["pp"]

    @property
    def tp_enabled(self) -> bool:
        return "tp" in self.uses

    @property
    def dp_size(self) -> int:
        return self.degrees["dp_replicate"] * self.degrees["dp_shard"]


@dataclass(frozen=True)
class Machine:
    """What the plan's automatic levers see of this machine (runplan/levers.py)."""

    device: str
    """cuda or cpu."""
    capability: tuple[int, int] | None = None
    """The first GPU's compute capability ((9, 0): H100, H200)."""
    triton: bool = False
    """Triton imports here (inductor's GPU kernels and paratrain's own need it)."""
    gpu: str = ""

    @property
    def kernels(self) -> bool:
        """paratrain's Triton kernels run here as measured: a GPU of compute capability 8.0+
        (bf16 tensor cores) with Triton."""
        return self.device == "cuda" and self.triton and (self.capability or (0, 0)) >= (8, 0)


@dataclass(frozen=True)
class Choice:
    """One lever as the plan settles it."""

    key: str
    """The dotted config key (train.compile, model.kernels, ...)."""
    value: Any
    reason: str
    """One short line: why this value here (with the results file behind it, where measured)."""
    by: str
    """auto (decided by the plan), plain (levers=plain) or set (given explicitly: it wins)."""


def no_levers(cfg: Any, layout: Layout, machine: Machine) -> dict[str, tuple[Any, str]]:
    return {}


def no_imports(cfg: Any) -> tuple[str, ...]:
    return ()


@dataclass(frozen=True)
class BuildContext:
    """What a task's build gets on each rank."""

    cfg: Any
    """The run's (resolved) RunConfig: the task reads its own sections (model, data, ...)."""
    layout: Layout
    device: torch.device
    is_main: bool
    """Rank 0: the one that prints and writes shared files."""
    dp_rank: int
    dp_size: int
    """This rank's place among the data-parallel ranks: which batches it reads."""
    policy: Any
    """precision.Policy: parameter dtype and autocast."""
    loader_batch: int
    """Samples per loader batch on this rank (DataParallel: the batch of all its GPUs)."""
    even_val: bool
    """Held-out batches must be as many on every rank (a forward that is a collective: FSDP,
    tensor parallel)."""
    out_dir: Path | None = None
    """The run's folder: where a task writes its own artifacts during training (a GAN's sample
    grids). None where a task is built outside a run (a plan's count, a test)."""

    def one_batch_each(self, rows: int) -> None:
        """Refuse in one line training rows fewer than one batch on every data-parallel rank
        (each rank reads all of them under the full sampler)."""
        if rows < self.loader_batch * (self.dp_size if self.layout.sampler != "full" else 1):
            raise UserError(
                f"data.batch_size: {rows} training rows are fewer than one batch on every "
                f"data-parallel rank ({self.loader_batch} x {self.dp_size})"
            )


@dataclass(frozen=True)
class Task:
    """A task: what it trains, what it reads, what it trains with, and its three functions."""

    name: str
    reads: tuple[str, ...]
    """The data.source values it reads (the first task that reads a source is `auto`'s)."""
    layouts: frozenset[str]
    """The LAYOUTS it trains with; runplan refuses the others in one line."""
    check: Callable[[Any, Layout], None]
    """(config, layout) -> None: this task's own settings against each other and the layout,
    before anything runs; raises ValueError naming the key."""
    preflight: Callable[[Any, Layout, bool], None]
    """(config, layout, cuda) -> None: what needs this machine or its files (UserError), once,
    before any process starts."""
    build: Callable[[BuildContext], Workload]
    precisions: frozenset[str] = frozenset(PRECISIONS)
    counts_tokens: bool = False
    """Throughput in tokens (Workload.loss returns the batch's trained tokens) and MFU."""
    model_keys: str = "builder"
    """Where the model comes from: builder (model.name), huggingface (model.path or
    model.shape), python (the object given to paratrain.train)."""
    describes: str = ""
    """One line for the plan: what is trained, on what loss."""
    refusals: dict[str, str] = field(default_factory=dict)
    """Why it does not train with a layout, where more can be said than that it does not
    ({"tp": "..."}): the refusal's line."""
    family: FamilyTraits = FamilyTraits()
    """What its model family allows (the spec's traits, models/*): compile by default, float8,
    the decoder's or the images' levers. Asked as task.compiles, task.fp8, ... below."""
    levers: Callable[[Any, Layout, Machine], dict[str, tuple[Any, str]]] = no_levers
    """(config, layout, machine) -> {dotted key: (value, reason)}: the automatic levers this
    task knows best (CUDA graphs for its batches, its kernels), read after train.compile is
    decided; a key it leaves out takes the plain setting (runplan/levers.py)."""
    # What the parts outside tasks/ ask of a task, each a question of its own (never its name):
    unread: tuple[str, ...] = ()
    """The config sections (lora, gan) and dotted keys (model.shape, data.packing) it never
    reads: result.json's config leaves them out, so it reads as the run it describes."""
    lora: bool = False
    """lora.enabled puts LoRA adapters (peft) on its model: only they train."""
    export_format: str = "safetensors"
    """What `paratrain export` writes of a checkpoint: safetensors (the model's tensors), or
    huggingface (the model rebuilt and saved by transformers, a LoRA run's by peft)."""
    imports: Callable[[Any], tuple[str, ...]] = no_imports
    """(config) -> the third-party modules its build imports: the CPU workers' fork server
    imports them once (runner.worker_imports), and no others."""
    held_out_line: Callable[[dict[str, Any]], str] | None = None
    """(result.json) -> the summary line's held-out part, where its metrics are not an
    accuracy or a loss (the GAN's two losses); None: held-out accuracy, else loss."""
    footprint: Callable[[Any], dict[str, int] | None] | None = None
    """(config) -> what its model takes, counted on the meta device (nothing allocated or
    computed): parameters, trainable, saved_per_sample (the bytes autograd keeps for backward
    per sample, in fp32), input_per_sample; None where it cannot tell. None: no estimate of a
    run's memory for this task (runplan/cpu.py)."""

    # the family's traits, asked of the task that trains it
    @property
    def compiles(self) -> bool:
        return self.family.compiles

    @property
    def fp8(self) -> bool:
        return self.family.fp8

    @property
    def decoder_levers(self) -> bool:
        return self.family.decoder_levers

    @property
    def image_levers(self) -> bool:
        return self.family.image_levers


@dataclass(frozen=True)
class PipelineHooks:
    """What a task tells the pipeline schedule."""

    split: Callable[[Any], tuple[torch.Tensor, torch.Tensor, Any]]
    """batch -> (the first stage's input, the last stage's target, number of loss terms)."""
    loss_sum: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    """(last stage's output, target) -> the micro-batch's summed loss."""
    score: Callable[[torch.Tensor, torch.Tensor], dict[str, float]]
    """(output, target) -> held-out sums (correct and total; summed loss and tokens)."""
    summarize: Callable[[dict[str, float]], dict[str, float]]
    """Summed held-out counts over the ranks -> metrics."""
    score_keys: tuple[str, ...]
    """The names score returns (every rank sums them, the stages without scores too)."""
    tokens: Callable[[Any], Any] = lambda batch: None
    """batch -> the tokens it holds, for tokens/s (None for images)."""


@dataclass
class StepContext:
    """What a task's own optimizer step gets (Workload.step): its wrapped models, their
    optimizers and the few things the trainer decides. Not the trainer itself."""

    parts: dict[str, nn.Module]
    """Workload.parts as trained: each under its own data-parallel wrapper."""
    optimizers: list
    """One per part, in the parts' order."""
    scaler: Any
    """GradScaler (fp16) or None."""
    step: int
    """The optimizer steps taken before this one."""
    finite: Callable[[torch.Tensor], bool]
    """loss -> whether it and the gradients are finite on every rank (a collective); always
    True when the NaN guard is off."""
    no_sync: Callable[[nn.Module], contextlib.AbstractContextManager]
    """module -> a context whose backward keeps that module's gradients local, to be
    synchronised by a later backward (DDP's no_sync; FSDP2's requires_gradient_sync off)."""
    discard: Callable[[nn.Module], contextlib.AbstractContextManager]
    """module -> a context for a backward whose gradients of that module are thrown away: no
    all-reduce where the wrapper can skip it (DDP); FSDP2 reduces them (its unsynchronised
    gradients would sit where zero_grad does not reach)."""


@dataclass(frozen=True)
class Matmul:
    """One GEMM a training step runs `count` times: (M, N, K) as torch calls it."""

    m: int
    n: int
    k: int
    count: int = 1


@dataclass(frozen=True)
class Attention:
    """Causal attention's forward and backward over `batch` sequences of `seq` tokens, `heads`
    query heads sharing `kv_heads` key-value heads of `head_dim`, `count` times a step."""

    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    count: int = 1


def linear_matmuls(
    tokens: int, fan_in: int, fan_out: int, *, weight_grad: bool = True, count: int = 1
) -> list[Matmul]:
    """A linear layer's GEMMs in one training step as torch runs them: the forward X W^T
    (tokens, out, in), the input's gradient dY W (tokens, in, out) and, where the weight trains,
    its gradient dY^T X (out, in, tokens)."""
    out = [Matmul(tokens, fan_out, fan_in, count), Matmul(tokens, fan_in, fan_out, count)]
    return out + ([Matmul(fan_out, fan_in, tokens, count)] if weight_grad else [])


@dataclass(frozen=True)
class Workload:
    """What a task's build returns: everything the trainer runs, nothing about how it is laid
    over the ranks. Frozen: what the trainer learns later (the run folder) is the build
    context's, not written back here."""

    model: nn.Module
    """The model with dtype, LoRA and the like applied; not yet parallelized or compiled."""
    spec: ModelSpec
    """The model family's spec: blocks, TP plan, pipeline cut, FLOPs."""
    train: Iterable
    """Yields batches already on the device; len() is micro-batches per epoch."""
    val: Iterable | None
    sampler: Any
    """data.samplers.EpochSampler: set_epoch(epoch, skip) before each epoch."""
    loss: Callable[[nn.Module, Any], tuple[torch.Tensor, torch.Tensor | None]]
    """(model, batch) -> (mean loss, tokens in the batch or None for images)."""
    evaluate: Callable[[nn.Module, Iterable], dict[str, float]]
    """Held-out metrics, already summed over ranks."""
    pipeline: PipelineHooks | None = None
    """How a pipeline's stages split a batch and score it."""
    info: dict[str, Any] = field(default_factory=dict)
    """Facts for result.json (real data or not, classes, tokens, random init, ...)."""
    rows: dict[str, int] = field(default_factory=dict)
    """Samples (or rows of tokens) read: {"train": N, "val": M} over all ranks, for the plan."""
    flops_per_token: float | None = None
    """For MFU (language models), counted on the whole model before any cut or shard."""
    finish: Callable[[nn.Module, Path], dict[str, str]] | None = None
    """Rank-collective; saves artifacts (a LoRA adapter) and returns their paths."""
    parts: dict[str, nn.Module] | None = None
    """A task of several models trained apart (a GAN's generator and discriminator): the
    model's children by name. Each is parallelized on its own (its own DDP / FSDP wrapper) and
    gets its own optimizer; `model` is their container, what checkpoints and evaluations see."""
    step: Callable[[StepContext, Any], tuple[torch.Tensor, torch.Tensor | None, bool]] | None = None
    """A task's own optimizer step, (context, batch) -> (loss, tokens or None, applied): for
    tasks whose step is not one forward, one loss, one backward and one optimizer step (a
    GAN's two alternating updates)."""
    known_loss: bool = True
    """The model's output goes straight into a loss paratrain or torch wrote (no in-place op
    on it before backward): FSDP2's warning that the root returned a view is then noise."""
    compile_units: list[nn.Module] | None = None
    """Repeated units (decoder layers, the chunked loss): torch.compile compiles each in place
    instead of the whole model, so one graph serves every layer and the wrapper code (peft, the
    loss) stays eager."""
    floor: tuple[Matmul | Attention, ...] | None = None
    """The matmuls and attention one training step must do (the model's own shapes at the
    run's batch): train.floor times them alone here, the step's floor (meters/floor.py)."""


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under DP/DDP and torch.compile wrappers, and under wrappers without
    parameters of their own that name the module inside (`state_dict_root`: the causal LM's loss
    wrapper), so checkpoints carry the model's own parameter names whatever wraps it."""
    from torch.nn.parallel import DistributedDataParallel

    while True:
        if isinstance(model, (nn.DataParallel, DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif getattr(model, "state_dict_root", None):
            model = getattr(model, model.state_dict_root)
        else:
            return model


def whole_tensor(t):
    """A value computed on shards (a DTensor: the loss over vocabulary shards) as a plain tensor;
    a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t
