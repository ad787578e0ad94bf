"""Evaluator: the held-out metrics at the end of each epoch (train.eval), of the model the run
would return: under local SGD / DiLoCo the replicas' mean, with BatchNorm statistics averaged
over the ranks first (ddp.broadcast_buffers=false); a pipeline scores on its last stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paratrain.protocols import unwrap


class Evaluator:
    """watchdog: told the evaluation runs; model: the model as trained (its replicas averaged
    into it for the evaluation: sync.one_model); eval_model: the one scored; val: the
    held-out batches, None without; score: the task's evaluate; pipe: a pipeline's schedule,
    which scores on its last stage, else None; before: what the model needs first (BatchNorm
    statistics averaged)."""

    def __init__(
        self,
        watchdog,
        *,
        enabled: bool,
        model,
        eval_model,
        val,
        score: Callable,
        sync,
        step_context: Callable,
        pipe: Any = None,
        autocast: Callable | None = None,
        loader_batch: int = 0,
        before: Callable[[], None] = lambda: None,
    ):
        self.watchdog, self.enabled = watchdog, enabled and val is not None
        self.model, self.eval_model, self.val, self.score = model, eval_model, val, score
        self.sync, self.step_context, self.before = sync, step_context, before
        self.pipe, self.autocast, self.loader_batch = pipe, autocast, loader_batch

    def __call__(self, step: int) -> dict[str, float]:
        if not self.enabled:
            return {}
        self.watchdog.beat(step, "evaluation")
        self.before()
        with self.step_context(), self.sync.one_model(unwrap(self.model)):
            if self.pipe is not None:
                return self.pipe.evaluate(
                    self.eval_model, self.val, self.autocast, self.loader_batch
                )
            return self.score(self.eval_model, self.val)
