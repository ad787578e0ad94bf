"""`paratrain plan`'s model (issue 18, first step): step time, communication and memory per GPU
of each data-parallel strategy at N GPUs, from a one-device calibration and a link's bandwidth.
Pure functions; every formula is the one written in its docstring, tested on hand-computed cases.

Communication volumes per step, as nccl-tests counts them (bus bandwidth: bytes each GPU sends
and receives over its link):
- DDP: a ring all-reduce of the gradients, 2(N-1)/N x gradient bytes (Patarasuk & Yuan 2009;
  nccl-tests' busbw factor);
- FSDP (ZeRO-3): the parameters all-gathered in forward and again in backward, the gradients
  reduce-scattered: (N-1)/N x (2 x parameter bytes + gradient bytes) (Rajbhandari et al. 2020);
- local SGD / DiLoCo every H steps: one all-reduce of the parameters / H.
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

    @property
    def compute_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s


def ring(n: int) -> float:
    """2(N-1)/N: what a ring all-reduce moves per GPU, per byte reduced."""
    return 2 * (n - 1) / n if n > 1 else 0.0


def shard(n: int) -> float:
    """(N-1)/N: what an all-gather or a reduce-scatter moves per GPU, per byte of the whole."""
    return (n - 1) / n if n > 1 else 0.0


def comm_bytes(strategy: str, cal: Calibration, n: int, every: int = 1) -> float:
    """Bytes each GPU moves over its link per optimizer step."""
    params, grads = cal.params * cal.param_bytes, cal.params * cal.grad_bytes
    if strategy == "ddp":
        return ring(n) * grads
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
        last = min(bucket_bytes, cal.params * cal.grad_bytes) * ring(n) / bw if n > 1 else 0.0
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
    state = cal.params * (cal.param_bytes + cal.grad_bytes + cal.optim_bytes)
    if strategy == "fsdp":
        gathered = 2 * cal.largest_block_params * (cal.param_bytes + cal.grad_bytes)
        return state / n + gathered + cal.activation_bytes
    return state + cal.activation_bytes


def bubble(stages: int, microbatches: int) -> float:
    """The idle share of a GPipe / 1F1B step: (p-1)/(m+p-1)."""
    return (stages - 1) / (microbatches + stages - 1)


def scaling_efficiency(strategy: str, cal: Calibration, n: int, bus_gbps: float, **kw) -> float:
    """Throughput at N over N x one device's: compute / step at N (the per-GPU batch fixed)."""
    return cal.compute_s / step_time(strategy, cal, n, bus_gbps, **kw)["step_s"]
