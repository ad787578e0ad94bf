"""parallel.*, ddp.*, sync.*, pipeline.*, split.*: the degrees of the mesh and the settings of each
parallelism that is applied from outside the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

AXES = ("pp", "dp_replicate", "dp_shard", "tp")
Mode = Literal["every_step", "local_sgd", "diloco", "stale"]


@dataclass(kw_only=True)
class ParallelConfig:
    """Degrees of parallelism (parallel.*): their product is the number of processes."""

    dp_replicate: int | None = None
    """Data-parallel replicas (DDP; with dp_shard > 1, the replicated axis of HSDP). null: the
    ranks the other degrees leave, or 1 when another degree is -1."""
    dp_shard: int = 1
    """Data-parallel ranks that shard weights, gradients and optimizer state among themselves
    (FSDP2); -1: the ranks the other degrees leave."""
    tp: int = 1
    """Tensor parallel: each decoder layer's projections split over this many ranks (language
    models; torch.distributed.tensor.parallel); -1: the ranks the others leave."""
    pp: int = 1
    """Pipeline stages, one per rank along this axis (torch.distributed.pipelining; pipeline.*
    sets micro-batches and schedule); -1: the ranks the others leave."""
    sequence_parallel: bool = True
    """With tp > 1: the norms and residual stream are split along the sequence between the
    tensor-parallel ranks too (less activation memory, reduce-scatter + all-gather in place of
    all-reduce)."""
    loss_parallel: bool = True
    """With tp > 1 (and pp = 1): lm_head's logits stay split over the vocabulary and the
    cross-entropy is computed on the shards (torch's loss_parallel); false gathers whole logits."""
    cpu_offload: bool = False
    """With FSDP (strategy=fsdp, dp_shard > 1, or fsdp on one GPU): the sharded weights,
    gradients and optimizer state live in host memory and the optimizer step runs on the CPU
    (FSDP2's CPUOffloadPolicy); each block's weights come to the GPU for its forward and
    backward. For models whose training state does not fit the GPUs; slower."""

    def __post_init__(self) -> None:
        for axis in AXES:
            value = getattr(self, axis)
            if value is not None and value != -1 and value < 1:
                raise ValueError(f"{axis}: must be >= 1 or -1 (infer), got {value}")
        inferred = [a for a in AXES if getattr(self, a) == -1]
        if len(inferred) > 1:
            raise ValueError(
                f"{inferred[1]}: only one degree can be -1 (inferred); got -1 for "
                f"{' and '.join(inferred)}"
            )

    def degrees(self) -> dict[str, int | None]:
        return {axis: getattr(self, axis) for axis in AXES}


@dataclass(kw_only=True)
class DDPConfig:
    """DistributedDataParallel's settings (strategies ddp-full, ddp-rr, ddp-ds)."""

    bucket_cap_mb: float = 25.0
    """Gradient bucket size (MiB): a bucket is all-reduced as soon as its gradients are ready, so
    smaller buckets start communicating earlier in backward, with more calls."""
    gradient_as_bucket_view: bool = False
    """Gradients are views into the all-reduce buckets: no copy into and out of them, less memory."""
    static_graph: bool = False
    """The model uses the same parameters every step: DDP skips per-step bookkeeping."""
    broadcast_buffers: bool = True
    """Copy rank 0's buffers (BatchNorm running statistics) to every rank before each forward, as
    DDP does by default. false skips that collective (and its per-buffer copies, which made a
    compiled MobileNetV2 step host-bound: 1,455 -> 1,781 img/s on one H200 with the two settings
    above): each rank keeps the statistics of its own batches, which training in train mode does
    not read; paratrain averages them over the ranks before each evaluation and checkpoint."""
    gradient_compression: Literal["none", "fp16", "bf16", "int8", "powersgd"] = "none"
    """How gradients travel in the all-reduce (DDP communication hooks from
    torch.distributed.algorithms.ddp_comm_hooks): none, as computed (fp32 for fp32 weights);
    fp16 / bf16, each bucket cast to 16 bits for the all-reduce and back (half the bytes, the
    rounding of a 16-bit number); int8, every 512 gradients scaled by their largest on any rank
    and sent as 8-bit integers (an all-gather: the seed's 8-bit quantisation, about a quarter of
    fp32's bytes; every element within its chunk's max|g| / 254 of the exact mean); powersgd,
    each gradient matrix sent as a low-rank product (PowerSGD with error feedback: far fewer
    bytes, an approximation the next steps correct)."""
    powersgd_rank: int = 1
    """PowerSGD: the rank of the approximation (higher: closer to the exact gradient, more bytes)."""
    powersgd_start_step: int = 10
    """PowerSGD: plain all-reduces for this many steps first (at least 2), while the gradients
    change fastest."""
    split_compiled_graph: bool = True
    """With train.compile: split the compiled graph at bucket boundaries (TorchDynamo's
    DDPOptimizer) so the all-reduce of early buckets overlaps the rest of backward. false keeps
    one graph (more fusion, fewer launches); the all-reduce then waits for the whole backward,
    which costs little when the gradients are small."""

    def __post_init__(self) -> None:
        if self.bucket_cap_mb <= 0:
            raise ValueError(f"bucket_cap_mb: must be > 0, got {self.bucket_cap_mb}")
        if self.powersgd_rank < 1:
            raise ValueError(f"powersgd_rank: must be >= 1, got {self.powersgd_rank}")
        if self.powersgd_start_step < 2:
            # PowerSGDState refuses 1 with error feedback: the first step builds its state
            raise ValueError(f"powersgd_start_step: must be >= 2, got {self.powersgd_start_step}")


@dataclass(kw_only=True)
class SyncConfig:
    """How often the data-parallel replicas (DDP) agree."""

    mode: Mode = "every_step"
    """every_step: DDP all-reduces every step's gradients (exact: equals one process with the
    whole batch). local_sgd: each replica steps alone; the parameters are averaged every
    `every_steps` steps (torch.distributed.algorithms.model_averaging). diloco: each replica's
    inner optimizer steps alone for `every_steps` steps, then the mean change is applied by an
    outer Nesterov SGD (arXiv 2311.08105). stale: each step's gradient all-reduce runs during the
    next step's forward and backward and is applied one step late."""
    every_steps: int = 16
    """local_sgd / diloco: local steps between two averagings (DiLoCo's H)."""
    warmup_steps: int = 0
    """Synchronous steps (every_step) first, while the model changes fastest."""
    outer_lr: float = 0.7
    """diloco: the outer optimizer's learning rate (1 with no momentum: plain averaging)."""
    outer_momentum: float = 0.9
    """diloco: the outer optimizer's Nesterov momentum (0: none)."""
    simulated_gbps: float = 0.0
    """A simulated slow link (0: off): every gradient / parameter collective completes no sooner
    than its payload at this many Gbit/s (parallel/slowlink.py), to see on one machine where each
    mode pays. A simulation, stated in result.json."""

    def __post_init__(self) -> None:
        if self.every_steps < 1:
            raise ValueError(f"every_steps: must be >= 1, got {self.every_steps}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps: must be >= 0, got {self.warmup_steps}")
        if self.outer_lr <= 0 or not 0 <= self.outer_momentum < 1:
            raise ValueError("outer_lr must be > 0 and outer_momentum in [0, 1)")
        if self.simulated_gbps < 0:
            raise ValueError(f"simulated_gbps: must be >= 0 (0: off), got {self.simulated_gbps}")


@dataclass(kw_only=True)
class PipelineConfig:
    """Pipeline parallelism's settings (parallel.pp > 1, or strategy=pipeline)."""

    microbatches: int = 4
    """Micro-batches per step: each stage works on one while the others work on the rest. More
    of them shrink the idle 'bubble' ((stages-1)/(microbatches+stages-1) of the step) but give
    each kernel less work. data.batch_size must divide by it."""
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = "1f1b"
    """gpipe: all forwards, then all backwards (activations of every micro-batch held at once);
    1f1b: one forward, one backward in turn once the pipe is full (at most `stages` held);
    interleaved-1f1b (Narayanan et al. 2021, language models): each rank holds
    stages_per_rank smaller stages, looped (rank r holds stages r, r + pp, ...), which shrinks
    the bubble by that factor for as many more activation sends."""
    stages_per_rank: int = 2
    """With interleaved-1f1b: the stages each rank holds (the decoder layers are cut into
    pp x stages_per_rank stages). The other schedules hold one."""
    boundaries: list[int] = field(default_factory=list)
    """Unit indices where stages 2, 3, ... begin (one fewer than the stages), to balance the
    stages' compute by hand: MobileNetV2's early blocks work on large images with few weights.
    Units are an image model's stem / blocks / head, a language model's decoder layers (the
    embedding goes with the first stage, norm and lm_head with the last). Empty: near-equal
    unit counts."""

    def __post_init__(self) -> None:
        if self.stages_per_rank < 1:
            raise ValueError(f"stages_per_rank: must be >= 1, got {self.stages_per_rank}")
        if self.microbatches < 1:
            raise ValueError(f"microbatches: must be >= 1, got {self.microbatches}")
        b = self.boundaries
        if any(x < 1 for x in b) or any(x >= y for x, y in zip(b, b[1:], strict=False)):
            raise ValueError(f"boundaries: must be increasing block indices >= 1, got {b}")


@dataclass(kw_only=True)
class SplitConfig:
    """strategy=split's settings."""

    devices: int | None = None
    """GPUs to spread the model over; default every visible GPU. On a CPU-only machine, 2 parts
    that both stay on the CPU (the code path runs; nothing is faster)."""
    boundaries: list[int] = field(default_factory=list)
    """Unit indices where parts 2, 3, ... begin; empty: near-equal unit counts."""

    def __post_init__(self) -> None:
        if self.devices is not None and self.devices < 1:
            raise ValueError(f"devices: must be >= 1, got {self.devices}")
        b = self.boundaries
        if any(x < 1 for x in b) or any(x >= y for x, y in zip(b, b[1:], strict=False)):
            raise ValueError(f"boundaries: must be increasing unit indices >= 1, got {b}")
