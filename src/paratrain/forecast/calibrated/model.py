"""The calibrated forecast's model: step time, communication and memory per GPU
of each data-parallel strategy at N GPUs, from a one-device calibration and a link's bandwidth.
Pure functions; every formula is the one written in its docstring, tested on hand-computed cases.

Communication volumes per step, as nccl-tests counts them (bus bandwidth: bytes each GPU sends
and receives over its link):
- DDP: a ring all-reduce of the gradients, 2(N-1)/N x gradient bytes (Patarasuk & Yuan 2009;
  nccl-tests' busbw factor);
- FSDP (ZeRO-3): the parameters all-gathered in forward and again in backward, the gradients
  reduce-scattered: (N-1)/N x (2 x parameter bytes + gradient bytes) (Rajbhandari et al. 2020);
- local SGD / DiLoCo every H steps: one all-reduce of the parameters / H;
- HSDP (shards within a node of G GPUs, replicas across R nodes): FSDP's volume over G on the
  node's link, and a ring all-reduce of each GPU's gradient shard over R across nodes:
  2(R-1)/R x gradient bytes / G (Zhang et al. 2023, PyTorch FSDP);
- tensor parallel over t (Megatron, Shoeybi et al. 2019): per decoder layer two all-reduces of
  the layer's activations in forward and two in backward, 4 x 2(t-1)/t x tokens x hidden x
  activation bytes per layer per micro-batch (sequence parallelism moves the same bytes as
  all-gathers and reduce-scatters), none of it overlapped;
- pipeline over p stages with m micro-batches: activations between stages (ignored: one
  tensor per micro-batch) and the bubble below.
Across nodes (N above the GPUs of one node) a ring crosses the slower inter-node link: the bus
bandwidth is then the inter-node one (an assumption the plan prints).
Overlap: DDP's buckets all-reduce while the backward goes on, so only what outlasts the
backward, plus the last bucket (it starts when the backward ends), is exposed; FSDP prefetches
the next block's all-gather under the current block's compute (exposed: what outlasts the
forward + backward). A pipeline of p stages and m micro-batches idles (p-1)/(m+p-1) of its
step (GPipe's bubble, Huang et al. 2019).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Calibration:
    """One device's step, measured: seconds of forward and backward (+ loss) and of the
    optimizer, the model's parameter count, bytes per parameter of weights / gradients /
    optimizer state, and the activation memory of one step at the measured batch."""

    forward_s: float
    backward_s: float
    optimizer_s: float
    params: int
    param_bytes: float = 4.0
    grad_bytes: float = 4.0
    optim_bytes: float = 8.0  # AdamW's two fp32 moments
    activation_bytes: float = 0.0
    largest_block_params: int = 0  # FSDP holds one block unsharded (two with prefetch)
    other_s: float = 0.0  # the rest of the step: data, checks, the host's own time
    trainable: int | None = None  # None: every parameter (LoRA trains a few)
    layers: int = 0  # a causal LM's decoder layers, hidden size and tokens per micro-batch:
    hidden: int = 0  # what tensor parallelism's collectives carry
    tokens_per_micro: int = 0
    micro_batches: int = 1  # gradient accumulation: micro-batches per optimizer step
    act_elem_bytes: float = 2.0  # bf16 / fp16 activations; 4 in fp32
    wire_bytes: float | None = None  # a gradient's bytes in DDP's all-reduce, where not its
    # own size: train.bf16_weights' bf16 gradients are summed in fp32 (parallel/ddp.py)

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s + self.other_s

    @property
    def ddp_grad_bytes(self) -> float:
        return self.grad_bytes if self.wire_bytes is None else self.wire_bytes

    @property
    def trained(self) -> int:
        return self.params if self.trainable is None else self.trainable

    @property
    def state_bytes(self) -> float:
        """Weights, and gradients and optimizer moments of the trained weights."""
        return self.params * self.param_bytes + self.trained * (self.grad_bytes + self.optim_bytes)


@dataclass(frozen=True)
class Links:
    """Bus bandwidths (GB/s, as `paratrain comm` prints them) within a node and across nodes,
    and the GPUs of one node. `measured`: ((N, GB/s), ...) all-reduces measured at local
    scales; the bandwidth at N is then the one measured at the largest scale <= N."""

    intra_gbps: float
    inter_gbps: float | None = None
    per_node: int = 8
    measured: tuple[tuple[int, float], ...] = ()

    def bus(self, n: int) -> float:
        if n > self.per_node and self.inter_gbps is not None:
            return min(self.intra_gbps, self.inter_gbps)
        below = [g for m, g in sorted(self.measured) if m <= n]
        return below[-1] if below else self.intra_gbps


def ring(n: int) -> float:
    """2(N-1)/N: what a ring all-reduce moves per GPU, per byte reduced."""
    return 2 * (n - 1) / n if n > 1 else 0.0


def shard(n: int) -> float:
    """(N-1)/N: what an all-gather or a reduce-scatter moves per GPU, per byte of the whole."""
    return (n - 1) / n if n > 1 else 0.0


def comm_bytes(strategy: str, cal: Calibration, n: int, every: int = 1) -> float:
    """Bytes each GPU moves over its link per optimizer step."""
    params, grads = cal.params * cal.param_bytes, cal.trained * cal.grad_bytes
    if strategy == "tp":
        per_layer = 4 * cal.tokens_per_micro * cal.hidden * cal.act_elem_bytes
        return ring(n) * per_layer * cal.layers * cal.micro_batches
    if strategy == "pp":
        return 0.0
    if strategy == "ddp":
        return ring(n) * cal.trained * cal.ddp_grad_bytes
    if strategy == "fsdp":
        return shard(n) * (2 * params + grads)
    if strategy in ("local_sgd", "diloco"):
        return ring(n) * params / every
    raise ValueError(f"strategy: no communication model for {strategy!r}")


def step_time(
    strategy: str,
    cal: Calibration,
    n: int,
    bus_gbps: float,
    *,
    bucket_bytes: float = 25 * 2**20,
    every: int = 1,
) -> dict[str, float]:
    """-> compute, communication, exposed communication and step seconds at N GPUs over a link
    of `bus_gbps` GB/s of bus bandwidth (the figure `paratrain comm` prints)."""
    bw = bus_gbps * 1e9
    comm = comm_bytes(strategy, cal, n, every) / bw if n > 1 else 0.0
    if strategy == "ddp":
        last = min(bucket_bytes, cal.trained * cal.ddp_grad_bytes) * ring(n) / bw if n > 1 else 0.0
        exposed = max(comm - cal.backward_s, 0.0) + min(last, comm)
    elif strategy == "fsdp":
        exposed = max(comm - cal.forward_s - cal.backward_s, 0.0)
    else:  # the averaging blocks the step it happens in
        exposed = comm
    return {
        "compute_s": cal.compute_s,
        "comm_s": comm,
        "exposed_s": exposed,
        "step_s": cal.compute_s + exposed,
    }


def memory_per_gpu(strategy: str, cal: Calibration, n: int) -> float:
    """Bytes on each GPU: weights, gradients and optimizer state (whole, or a 1/N shard under
    FSDP plus the largest block gathered twice: the one computing and the one prefetched), and
    the activations of the per-GPU batch."""
    state = cal.state_bytes
    if strategy == "fsdp":
        gathered = 2 * cal.largest_block_params * (cal.param_bytes + cal.grad_bytes)
        return state / n + gathered + cal.activation_bytes
    return state + cal.activation_bytes


def model_parallel(strategy: str, cal: Calibration, n: int, bus_gbps: float, *, m: int = 4):
    """Tensor or pipeline parallel over N GPUs, one replica: the per-GPU batch / N.

    tp: forward, backward and optimizer split N ways, the layers' collectives exposed; the
    state split N ways, the activations not (without sequence parallelism).
    pp: each stage computes 1/N of the forward and backward, the schedule idles
    (p-1)/(m+p-1) of its step (its compute / N x (m+p-1)/m); a stage holds 1/N of the state and
    up to min(m, N) micro-batches (of 1/m of the batch) of its 1/N of the layers' activations.
    The host's own time (data, checks) is not split."""
    work = cal.forward_s + cal.backward_s
    if strategy == "tp":
        comm = comm_bytes("tp", cal, n) / (bus_gbps * 1e9) if n > 1 else 0.0
        step = (work + cal.optimizer_s) / n + comm + cal.other_s
        memory = cal.state_bytes / n + cal.activation_bytes
        return {
            "compute_s": step - comm,
            "comm_s": comm,
            "exposed_s": comm,
            "step_s": step,
            "memory_bytes": memory,
        }
    if strategy == "pp":
        compute = work / n * (m + n - 1) / m + cal.optimizer_s / n + cal.other_s
        memory = cal.state_bytes / n + cal.activation_bytes * min(m, n) / (m * n)
        return {
            "compute_s": compute,
            "comm_s": 0.0,
            "exposed_s": 0.0,
            "step_s": compute,
            "memory_bytes": memory,
        }
    raise ValueError(f"strategy: {strategy!r} is not tensor or pipeline parallel")


def hsdp_step(cal: Calibration, n: int, links: Links) -> dict[str, float]:
    """HSDP over N GPUs: shards within a node (G = min(N, per_node)), R = N / G replicas
    across nodes. FSDP's volume over G at the node's bandwidth, the replicas' all-reduce of
    each GPU's gradient shard over R at the inter-node one; both hidden under the forward and
    backward as far as they fit."""
    g = min(n, links.per_node)
    r = max(n // g, 1)
    inside = comm_bytes("fsdp", cal, g) / (links.intra_gbps * 1e9) if g > 1 else 0.0
    across = ring(r) * cal.trained * cal.grad_bytes / g / (links.bus(n) * 1e9) if r > 1 else 0.0
    comm = inside + across
    exposed = max(comm - cal.forward_s - cal.backward_s, 0.0)
    return {
        "compute_s": cal.compute_s,
        "comm_s": comm,
        "exposed_s": exposed,
        "step_s": cal.compute_s + exposed,
        "memory_bytes": memory_per_gpu("fsdp", cal, g),
    }


def bubble(stages: int, microbatches: int, per_rank: int = 1) -> float:
    """The idle share of a GPipe / 1F1B step: (p-1)/(m+p-1). With `per_rank` = v stages on each
    rank (interleaved 1F1B, Narayanan et al. 2021) a rank's work is m x v chunks of 1/v of its
    layers and the fill and drain still take p-1 chunks: (p-1)/(v m + p-1)."""
    return (stages - 1) / (per_rank * microbatches + stages - 1)


def collective_s(whole_bytes: float, n: int, bus_gbps: float, kind: str = "all_gather") -> float:
    """Seconds of one all-gather / reduce-scatter (whole_bytes: the gathered tensor, or the
    tensor reduced) or all-reduce over n GPUs at `bus_gbps` of bus bandwidth (nccl-tests'
    busbw: time = bytes x factor / busbw, the factor shard(n) or ring(n))."""
    if n <= 1:
        return 0.0
    factor = ring(n) if kind == "all_reduce" else shard(n)
    return whole_bytes * factor / (bus_gbps * 1e9)


def scaling_efficiency(strategy: str, cal: Calibration, n: int, bus_gbps: float, **kw) -> float:
    """Throughput at N over N x one device's: compute / step at N (the per-GPU batch fixed)."""
    return cal.compute_s / step_time(strategy, cal, n, bus_gbps, **kw)["step_s"]
