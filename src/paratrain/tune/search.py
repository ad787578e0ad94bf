"""`paratrain tune`'s search: coordinate descent over the space's levers, each trial a short run
in its own process through the bench machinery (a crash, OOM or hang takes only that trial),
each stored in the results DB as it ends (a second `tune` of the same recipe and space reuses
every finished trial: the search resumes).

One lever at a time, in the space's order: try its other values with the best set-up so far,
keep the fastest that passes the numerics guard if it beats the best by more than `min_gain`
(timing noise). Pruned before running: a batch the memory model says cannot fit (the best
trial's activations scaled with the batch, plus its model state), and any set-up already run
(the same run key). The search stops at the time budget: a trial starts only when the time left
covers the median trial so far.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paratrain.bench.execute import execute_run
from paratrain.bench.store import Row, Store, error_line
from paratrain.bench.sweep import RunSpec
from paratrain.config import RunConfig, load_config
from paratrain.errors import ConfigError, UserError
from paratrain.meters.metrics import memory_capacity_bytes
from paratrain.tasks import get_task
from paratrain.tune.space import Space


@dataclass
class TuneArgs:
    budget_s: float = 20 * 60
    steps: int = 30
    loss_band: float = 0.05
    min_gain: float = 0.02
    reference_precision: str | None = None
    trial_timeout_s: float = 900
    max_passes: int = 3
    db: Path | None = Path("paratrain-results.db")
    """The results DB the trials go to; None: a dry run (nothing written)."""
    out: Path = Path("tune")
    sets: list[str] = field(default_factory=list)
    progress: bool = True


@dataclass
class Trial:
    index: int
    choice: dict[str, Any]
    """Every lever's value in this trial."""
    changed: dict[str, Any]
    """The levers that differ from the recipe."""
    status: str = "planned"  # ok | numerics | failed | timeout | pruned | invalid | budget
    throughput: float | None = None
    memory_bytes: float | None = None
    energy_per_unit: float | None = None
    loss: float | None = None
    loss_vs_reference: float | None = None
    seconds: float = 0.0
    reused: bool = False
    note: str = ""
    key: str | None = None
    row: Row | None = field(default=None, repr=False)

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.changed.items()) or "the recipe"

    @property
    def usable(self) -> bool:
        return self.status == "ok" and self.throughput is not None


def trial_overrides(space: Space, choice: dict[str, Any], steps: int, warmup: int) -> list[str]:
    """The settings of a trial: each lever's value, a short run (warm-up + `steps`), no
    evaluation or checkpoints, the loss logged every few steps for the numerics guard."""
    out: list[str] = []
    for lever in space.levers:
        # a lever at its baseline (the recipe's value, or the plan's auto choice) is left to
        # the recipe and the plan: a trial of another strategy decides its own levers
        if choice[lever.key] != lever.values[0]:
            out += lever.overrides(choice[lever.key])
    return out + [
        f"train.max_steps={warmup + steps}",
        "train.eval=false",
        "checkpoint.at_end=false",
        "checkpoint.every_steps=0",
        "log.progress=false",
        "log.tensorboard=false",
        f"log.every_steps={max(1, steps // 6)}",
    ]


def guard_loss(curve: list[list[float]]) -> float | None:
    """The mean logged loss over the trial's second half: what the guard compares."""
    if not curve:
        return None
    tail = curve[len(curve) // 2 :]
    return sum(loss for _, loss in tail) / len(tail)


class Search:
    def __init__(self, recipe: str, cfg: RunConfig, space: Space, args: TuneArgs):
        self.recipe, self.cfg, self.space, self.args = recipe, cfg, space, args
        # db None: a dry run, which lists the levers and writes nothing
        self.store = Store(args.db) if args.db is not None else None
        self.sweep = f"tune-{cfg.name}"
        self.trials: list[Trial] = []
        self.started = time.monotonic()
        self.reference: Trial | None = None
        self.lm = get_task(cfg.task).counts_tokens  # ranked by tokens/s, else samples/s
        rows = self.store.rows(self.sweep) if self.store else []
        self.done = {r.run_key: r for r in rows if r.status == "ok"}

    # ------------------------------------------------------------------ one trial

    def _config(self, choice: dict[str, Any], extra: list[str]) -> tuple[list[str], RunConfig]:
        overrides = [
            *self.args.sets,
            *trial_overrides(self.space, choice, self.args.steps, self.cfg.train.warmup_steps),
            *extra,
        ]
        return overrides, load_config(self.recipe, [f"name={self.cfg.name}", *overrides])

    def left_s(self) -> float:
        return self.args.budget_s - (time.monotonic() - self.started)

    def _affordable(self) -> bool:
        spent = [t.seconds for t in self.trials if t.seconds > 0 and not t.reused]
        typical = statistics.median(spent) if spent else 0.0
        return self.left_s() > typical

    def run(self, choice: dict[str, Any], extra: list[str] | None = None) -> Trial:
        changed = {
            lv.key: choice[lv.key] for lv in self.space.levers if choice[lv.key] != lv.values[0]
        }
        for item in extra or []:
            key, _, value = item.partition("=")
            changed[key] = value
        trial = Trial(len(self.trials) + 1, dict(choice), changed)
        self.trials.append(trial)
        try:
            overrides, config = self._config(choice, extra or [])
        except (ConfigError, UserError, ValueError) as e:
            trial.status, trial.note = "invalid", str(e).splitlines()[0][:200]
            return trial
        why_not = self._prune(choice, config)
        if why_not:
            trial.status, trial.note = "pruned", why_not
            return trial
        spec = RunSpec(self.sweep, trial.label, "paratrain", changed, overrides, config, 0)
        trial.key = spec.key
        row = self.done.get(spec.key)
        if row is not None:
            trial.reused = True
        elif not self._affordable():
            trial.status, trial.note = "budget", "not run: the time budget was spent"
            return trial
        else:
            t0 = time.monotonic()
            if not self.store.claim(spec.key):
                trial.status, trial.note = "failed", "another tune of this recipe is running it"
                return trial
            try:
                # a trial that starts gets its whole time limit: the budget decides what starts
                row = execute_run(
                    spec, self.args.out / "trials" / spec.key, self.args.trial_timeout_s
                )
                self.store.put(row)
            finally:
                self.store.release(spec.key)
            trial.seconds = time.monotonic() - t0
        self._read(trial, row)
        self._guard(trial)
        return trial

    def _read(self, trial: Trial, row: Row) -> None:
        if row.status != "ok":
            trial.status = row.status
            trial.note = error_line((row.error or "").strip())[:200]  # its cause (cause_of)
            return
        m = row.metrics or {}
        trial.throughput = m.get("tokens_per_s") if self.lm else m.get("unique_samples_per_s")
        trial.memory_bytes = m.get("peak_memory_bytes")
        energy = m.get("energy") or {}
        trial.energy_per_unit = energy.get("joules_per_token" if self.lm else "joules_per_sample")
        trial.loss = guard_loss((row.result or {}).get("curve") or [])
        trial.status = "ok"
        trial.row = row

    def _guard(self, trial: Trial) -> None:
        """The numerics guard: a finite loss, and against the reference's (when there is one
        and it is not this trial) at most `loss_band` higher."""
        if trial.status != "ok":
            return
        if trial.loss is None or trial.loss != trial.loss:  # none logged, or NaN
            trial.status, trial.note = "numerics", "no finite loss logged"
            return
        ref = self.reference
        if ref is None or ref is trial or not ref.loss:
            return
        trial.loss_vs_reference = trial.loss / ref.loss - 1
        if trial.loss_vs_reference > self.args.loss_band:
            trial.status = "numerics"
            trial.note = (
                f"loss {trial.loss:.4f} is {trial.loss_vs_reference:+.1%} against the "
                f"reference's {ref.loss:.4f} (band {self.args.loss_band:.0%})"
            )

    def _prune(self, choice: dict[str, Any], config: RunConfig) -> str | None:
        """A batch larger than the best trial's that the memory model says cannot fit."""
        best = self.best()
        if best is None or best.memory_bytes is None:
            return None
        row = best.row
        state = ((row.metrics or {}).get("model_state") if row else None) or {}
        kept = sum(
            state.get(k, 0) for k in ("parameter_bytes", "gradient_bytes", "optimizer_bytes")
        )
        ratio = config.data.batch_size / max(
            best.choice.get("data.batch_size", self.cfg.data.batch_size), 1
        )
        if ratio <= 1:
            return None
        predicted = kept + (best.memory_bytes - kept) * ratio
        limit = device_memory(config)
        if limit and predicted > limit:
            return (
                f"predicted {predicted / 2**30:,.1f} GiB (activations x{ratio:g}) > "
                f"{limit / 2**30:,.1f} GiB"
            )
        return None

    def _known(self, choice: dict[str, Any]) -> Trial | None:
        """A trial of this search with the same choice (a later pass asks again)."""
        return next(
            (t for t in self.trials if t.choice == choice and t.status not in ("budget",)), None
        )

    def best(self) -> Trial | None:
        usable = [t for t in self.trials if t.usable]
        return max(usable, key=lambda t: t.throughput) if usable else None

    # ------------------------------------------------------------------ the descent

    def _reference_extra(self) -> list[str] | None:
        """--reference-precision: the recipe's set-up in that precision is the guard's
        reference (None: the recipe itself is)."""
        p = self.args.reference_precision
        base = {lv.key: lv.values[0] for lv in self.space.levers}
        if p is None or base.get("precision", self.cfg.precision) == p:
            return None
        return [f"precision={p}"]

    def planned(self) -> int:
        """Trials of the first pass (a later pass adds those a changed set-up makes new)."""
        extra = self._reference_extra() is not None
        return 1 + extra + sum(len(lv.values) - 1 for lv in self.space.levers)

    def search(self, on_trial=None) -> dict[str, Any]:
        base = {lv.key: lv.values[0] for lv in self.space.levers}
        extra = self._reference_extra()
        if extra is not None:
            ref = self.run(base, extra)
            _notify(on_trial, ref)
            if not ref.usable:
                raise UserError(
                    f"tune: the reference run ({ref.label}) did not run ({ref.status}: {ref.note})"
                )
            self.reference = ref
        baseline = self.run(base)
        if self.reference is None:
            self.reference = baseline
        _notify(on_trial, baseline)
        if not baseline.usable:
            raise UserError(
                f"tune: the recipe itself did not run ({baseline.status}: {baseline.note}); "
                "fix it with `paratrain run` first"
            )
        best = baseline
        # passes until one changes nothing: a lever that did not pay alone (resizing on the
        # GPU while the model's compute bounds the step) may pay once others moved the bottleneck
        for _ in range(self.args.max_passes):
            before = best
            for lever in self.space.levers:
                tried = [best]
                for value in lever.values:
                    if value == best.choice[lever.key]:
                        continue
                    known = self._known({**best.choice, lever.key: value})
                    trial = known or self.run({**best.choice, lever.key: value})
                    tried.append(trial)
                    if known is None:
                        _notify(on_trial, trial)
                winner = max((t for t in tried if t.usable), key=lambda t: t.throughput)
                gain = 1 + self.args.min_gain
                if winner is not best and winner.throughput > best.throughput * gain:
                    best = winner
            if best is before or any(t.status == "budget" for t in self.trials):
                break
        return {"best": best, "baseline": baseline, "reference": self.reference}


def _notify(callback, trial: Trial) -> None:
    if callback:
        callback(trial)


def device_memory(config: RunConfig) -> float:
    import torch

    return memory_capacity_bytes(config.device != "cpu" and torch.cuda.is_available())
