"""The shape of paratrain's own checkpoint files, checked before any of it is used.

train_state.pt and rng_rank*.pt load with torch.load(weights_only=True): plain types and
tensors, but of any shape. A hand-edited or forged one (a loop state with a key of its own, a
step that is a string, a list instead of a dict, a random state of the wrong length) would fail
deep inside the trainer with a traceback; here it is named in one line before the run uses it.
"""

from __future__ import annotations

import random
from dataclasses import fields
from typing import Any

import torch

_COUNTS = ("step", "epoch", "step_in_epoch", "samples_in_epoch")
_SCALER = ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")


def _count(value) -> bool:
    return type(value) is int and value >= 0


def _number(value) -> bool:
    return type(value) in (int, float)


def _scaler(value) -> bool:
    return (
        isinstance(value, dict) and set(value) <= set(_SCALER) and all(map(_number, value.values()))
    )


def _bytes(value) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1


def train_state_problem(state: Any, loop_state: type) -> str | None:
    """What is wrong with train_state.pt's contents, or None: {"loop": the fields of
    `loop_state` (store.LoopState), "scaler": None or GradScaler's state, "world_size":
    processes, "layout": the writer's}."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict"
    if type(state.get("world_size")) is not int or state["world_size"] < 1:
        return f"world_size is {state.get('world_size')!r}, not a count of processes"
    if not isinstance(state.get("layout", {}), dict):
        return "layout is not a dict"
    scaler = state.get("scaler")
    if scaler is not None and not _scaler(scaler):
        return "scaler is not a loss scaler's state"
    return _loop_problem(state.get("loop"), {f.name for f in fields(loop_state)})


def _loop_problem(loop: Any, known: set[str]) -> str | None:
    if not isinstance(loop, dict):
        return "loop is not a dict"
    extra = sorted(str(k) for k in loop if k not in known)
    if extra:
        return f"loop holds keys of no loop state ({', '.join(extra[:3])})"
    if "step" not in loop:
        return "loop has no step"
    for key in _COUNTS:
        if key in loop and not _count(loop[key]):
            return f"loop.{key} is {loop[key]!r}, not a count"
    bad = loop.get("bad_steps", [])
    if not isinstance(bad, list) or not all(_count(b) for b in bad):
        return "loop.bad_steps is not a list of steps"
    return _losses_problem(loop.get("losses", {}))


def _losses_problem(losses: Any) -> str | None:
    """LoopState.losses as trainer/losses.py carries it: {} (written before they were kept), or
    the finished epochs' records and, where an epoch had begun, each rank's loss sum of it."""
    if not isinstance(losses, dict):
        return "loop.losses is not a dict"
    epochs = losses.get("epochs", [])
    if not isinstance(epochs, list) or not all(isinstance(e, dict) for e in epochs):
        return "loop.losses.epochs is not a list of epoch records"
    sums = losses.get("sums")
    if sums is None:
        return None
    if not isinstance(sums, list) or not all(map(_number, sums)):
        return "loop.losses.sums is not a list of numbers"
    for key in ("epoch", "good", "from_in_epoch", "replicas"):
        if not _count(losses.get(key)):
            return f"loop.losses.{key} is {losses.get(key)!r}, not a count"
    if losses["replicas"] < 1:
        return "loop.losses.replicas is 0"
    return None


def rng_problem(state: Any) -> str | None:
    """What is wrong with an rng_rank*.pt's contents (store.rng_state's shape), or None."""
    if not isinstance(state, dict):
        return f"a {type(state).__name__}, not a dict"
    for key in ("torch", "cuda"):
        value = state.get(key)
        if key == "cuda" and value is None:
            continue
        if not _bytes(value):
            return f"its {key} state is not a generator's state (bytes)"
    if state["torch"].numel() != torch.get_rng_state().numel():
        return f"its torch state has {state['torch'].numel()} bytes, not a CPU generator's"
    return _numpy_problem(state.get("numpy")) or _python_problem(state.get("python"))


def _numpy_problem(value: Any) -> str | None:
    import numpy as np

    size = np.random.get_state()[1].size
    if not (isinstance(value, (list, tuple)) and len(value) == 5):
        return "its numpy state is not numpy's 5 fields"
    kind, keys, pos, has_gauss, cached = value
    ok = isinstance(kind, str) and isinstance(keys, torch.Tensor) and keys.dtype == torch.int64
    ok = ok and keys.dim() == 1 and keys.numel() == size
    ok = ok and _count(pos) and pos <= size and type(has_gauss) is int and _number(cached)
    return None if ok else "its numpy state is not a Mersenne Twister's"


def _python_problem(value: Any) -> str | None:
    like = random.getstate()
    if not (isinstance(value, tuple) and len(value) == len(like)):
        return "its python state is not random.getstate()'s"
    version, internal, gauss = value
    ok = version == like[0] and isinstance(internal, tuple) and len(internal) == len(like[1])
    ok = ok and all(type(x) is int and 0 <= x < 2**32 for x in internal)
    ok = ok and internal[-1] < len(internal) and (gauss is None or _number(gauss))
    return None if ok else "its python state is not random.getstate()'s"
