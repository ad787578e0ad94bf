"""Evaluator: the held-out metrics at the end of each epoch (train.eval), of the model the run
would return: under local SGD / DiLoCo the replicas' mean, with BatchNorm statistics averaged
over the ranks first (ddp.broadcast_buffers=false); a pipeline scores on its last stage."""

from __future__ import annotations

from paratrain.protocols import unwrap


class Evaluator:
    def __init__(self, run, watchdog):
        self.run, self.watchdog = run, watchdog
        self.enabled = run.work.val is not None and run.cfg.train.eval

    def __call__(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        run = self.run
        self.watchdog.beat(run.state.step, "evaluation")
        run.sync_buffers()
        with run.step_context(), run.sync.one_model(unwrap(run.model)):
            if run.pipe is not None:
                return run.pipe.evaluate(
                    run.eval_model, run.work.val, run.policy.autocast, run.loader_batch
                )
            return run.work.evaluate(run.eval_model, run.work.val)
