"""How often the data-parallel replicas agree (seed 001 §5.3: synchronous against asynchronous
updates). every_step is DDP's all-reduce of each step's gradients: the replicas stay equal.
local_sgd and diloco let each replica step alone and average the models every `every_steps`
steps; stale overlaps each step's gradient all-reduce with the next step and applies it one step
late. The last three trade exactness for less waiting; what they cost in accuracy is measured,
not assumed (benchmarks/sync_modes.py).

Asynchronous SGD through a parameter server (workers pushing gradients whenever they finish) is
not built: it needs point-to-point traffic to a server process, which torch.distributed's
collectives do not give, and stale-1 over the all-reduce keeps the one property that matters on
a fast fabric (communication hidden behind compute) without unbounded staleness.

The step calls grad_sync (does DDP all-reduce this step?), before_optimizer (may the optimizer
step now? stale swaps in last step's averaged gradients here) and after_optimizer (averaging).
"""

from __future__ import annotations

import contextlib
import time

import torch
import torch.distributed as dist
from torch import nn

from paratrain.config.parallel import SyncConfig


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def ring(group) -> float:
    """2(N-1)/N: what a ring all-reduce puts on each rank's link per byte reduced (at N = 2 the
    payload itself)."""
    n = dist.get_world_size(group)
    return 2 * (n - 1) / n


def _mean_in_place(flat: torch.Tensor, group) -> None:
    dist.all_reduce(flat, group=group)  # SUM then divide: gloo has no AVG
    flat /= dist.get_world_size(group)


class EveryStep:
    """DDP's own all-reduce each step; bytes: the gradients as the compression hook sends them
    (None where it cannot be counted from the tensors: PowerSGD's factors vary by shape)."""

    def __init__(self, params: list[nn.Parameter], per_element: float | None, link=None):
        self.link = link  # a simulated slow link (parallel/slowlink.py), or None
        self.grad_bytes = (
            None
            if per_element is None
            else sum(p.numel() for p in params if p.requires_grad) * per_element
        )
        self.sent: float | None = 0.0
        # what checkpoints and evaluations exchanged to see one model (not training traffic)
        self.extra = 0.0

    def grad_sync(self, step: int) -> bool:
        return True

    def before_optimizer(self, step: int) -> bool:
        self.sent = None if self.grad_bytes is None else self.sent + self.grad_bytes
        return True

    def after_optimizer(self, step: int) -> None:
        pass

    def finish(self) -> None:
        pass

    # What a checkpoint keeps per rank: None where the replicas are equal (DCP's one copy does).
    keeps_replicas = False

    def one_model(self, model: nn.Module):
        return contextlib.nullcontext()  # the replicas are equal

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class LocalSGD(EveryStep):
    """Replicas step alone; every `every_steps` steps their parameters are averaged."""

    keeps_replicas = True  # between averagings each rank's weights and moments are its own

    def __init__(self, cfg: SyncConfig, params, per_element, group=None, link=None):
        super().__init__(params, per_element, link)
        self.cfg, self.params, self.group = cfg, list(params), group
        # the last step taken, and the last at which every replica held the same weights
        self.last_step: int | None = None
        self.averaged_at: int | None = None

    def hold(self, started: float, nbytes: float) -> None:
        if self.link is not None:
            self.link.hold(started, nbytes)

    def local(self, step: int) -> bool:
        return step > self.cfg.warmup_steps

    def grad_sync(self, step: int) -> bool:
        return not self.local(step)

    def before_optimizer(self, step: int) -> bool:
        if not self.local(step):
            return super().before_optimizer(step)
        return True

    def averaging_step(self, step: int) -> bool:
        return self.local(step) and (step - self.cfg.warmup_steps) % self.cfg.every_steps == 0

    def after_optimizer(self, step: int) -> None:
        self.last_step = step
        if self.averaging_step(step):
            self.average()

    def average(self, training: bool = True) -> None:
        """Every replica's parameters become their mean (model_averaging's own helper).
        training=False: for a checkpoint or an evaluation, counted apart from training's bytes."""
        from torch.distributed.algorithms.model_averaging.utils import average_parameters

        started = time.perf_counter()
        average_parameters(iter(self.params), self.group)
        size = nbytes(self.params)
        if training:
            self.hold(started, size * ring(self.group))
            self.sent = None if self.sent is None else self.sent + size
            self.averaged_at = self.last_step
        else:
            self.extra += size

    @contextlib.contextmanager
    def one_model(self, model: nn.Module):
        """Inside: every rank holds the replicas' mean (what the run would return now), for an
        evaluation or a checkpoint; after: each rank's own weights again, training unchanged."""
        if not self.apart():
            yield
            return
        own = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.average(training=False)
        try:
            yield
        finally:
            with torch.no_grad():
                model.load_state_dict(own)

    def apart(self) -> bool:
        """Whether the replicas may differ now: a local step since they last agreed."""
        last = self.last_step
        return last is not None and self.local(last) and self.averaged_at != last

    def finish(self) -> None:
        """The run's end: one model, the replicas' mean."""
        if self.apart():
            self.average()


class DiLoCo(LocalSGD):
    """Inner steps alone; every `every_steps` steps the replicas' mean change since the last
    outer step (the pseudo-gradient) is applied to the shared weights by Nesterov SGD, and every
    replica starts again from them."""

    def __init__(self, cfg: SyncConfig, params, per_element, group=None, link=None):
        super().__init__(cfg, params, per_element, group, link)
        # the weights all replicas last agreed on, in fp32, with the outer optimizer over them
        self.anchor = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.outer = torch.optim.SGD(
            self.anchor,
            lr=cfg.outer_lr,
            momentum=cfg.outer_momentum,
            nesterov=cfg.outer_momentum > 0,
        )

    def after_optimizer(self, step: int) -> None:
        self.last_step = step
        if not self.local(step):  # synchronous warm-up: the replicas are equal; follow them
            with torch.no_grad():
                for a, p in zip(self.anchor, self.params, strict=True):
                    a.copy_(p)
            return
        if not self.averaging_step(step):
            return
        with torch.no_grad():
            deltas = [a - p.float() for a, p in zip(self.anchor, self.params, strict=True)]
            flat = torch.cat([d.reshape(-1) for d in deltas])
            started = time.perf_counter()
            _mean_in_place(flat, self.group)
            self.hold(started, nbytes([flat]) * ring(self.group))
            self.sent = None if self.sent is None else self.sent + nbytes([flat])
            offset = 0
            for a in self.anchor:
                a.grad = flat[offset : offset + a.numel()].view_as(a).clone()
                offset += a.numel()
        self.outer.step()
        self.outer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for a, p in zip(self.anchor, self.params, strict=True):
                p.copy_(a)
        self.averaged_at = step  # every replica holds the shared weights again

    def state_dict(self) -> dict:
        return {"anchor": [a.detach() for a in self.anchor], "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """A replica's saved state; {}: start again from the weights as they are now (a resume
        from rank 0's copy), the outer momentum afresh."""
        with torch.no_grad():
            saved = state.get("anchor") or [p.detach() for p in self.params]
            for a, value in zip(self.anchor, saved, strict=True):
                a.copy_(value)
        if "outer" in state:
            self.outer.load_state_dict(state["outer"])


class Stale(EveryStep):
    """Staleness 1: step t's gradients start their all-reduce (asynchronous) once its backward
    is done, and the optimizer applies step t-1's averaged gradients, whose all-reduce ran during
    step t's forward and backward. The first stale step applies nothing; the last step's
    gradients are not applied (the run ends with its all-reduce waited for and dropped)."""

    def __init__(self, cfg: SyncConfig, params, per_element, group=None, link=None):
        super().__init__(params, per_element, link)
        self.cfg, self.params, self.group = cfg, list(params), group
        self.pending: tuple[dist.Work | None, torch.Tensor, float] | None = None

    keeps_replicas = True  # the all-reduce in flight: the gradients the next step applies

    def grad_sync(self, step: int) -> bool:
        return step <= self.cfg.warmup_steps

    def before_optimizer(self, step: int) -> bool:
        if step <= self.cfg.warmup_steps:
            return super().before_optimizer(step)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        flat /= dist.get_world_size(self.group)  # SUM of the shares: the mean (no AVG on gloo)
        started = time.perf_counter()
        work = dist.all_reduce(flat, group=self.group, async_op=True)
        self.sent = None if self.sent is None else self.sent + nbytes([flat])
        previous, self.pending = self.pending, (work, flat, started)
        if previous is None:
            for p in self.params:
                p.grad = None
            return False
        self.wait(previous)
        offset = 0
        for p in self.params:
            # (a checkpoint's pending gradients come back on the CPU)
            p.grad = previous[1][offset : offset + p.numel()].view_as(p).to(p.device, p.dtype)
            offset += p.numel()
        return True

    def wait(self, pending) -> None:
        work, flat, started = pending
        if work is not None:  # None: restored from a checkpoint, already complete
            work.wait()
        if self.link is not None:
            self.link.hold(started, nbytes([flat]) * ring(self.group))

    def finish(self) -> None:
        if self.pending is not None:
            self.wait(self.pending)
            self.pending = None

    def state_dict(self) -> dict:
        """The all-reduce in flight, completed: the mean gradients the next step applies."""
        if self.pending is None:
            return {"pending": None}
        self.wait(self.pending)
        self.pending = (None, self.pending[1], self.pending[2])
        return {"pending": self.pending[1]}

    def load_state_dict(self, state: dict) -> None:
        flat = state.get("pending")
        self.pending = None if flat is None else (None, flat, time.perf_counter())


MODES = {"every_step": EveryStep, "local_sgd": LocalSGD, "diloco": DiLoCo, "stale": Stale}


def build(cfg: SyncConfig, params, per_element: float | None, group=None, link=None):
    if cfg.mode == "every_step":
        return EveryStep(params, per_element, link)
    return MODES[cfg.mode](cfg, params, per_element, group, link)
