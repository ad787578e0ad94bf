"""resolve(config, world) -> RunPlan: what a config comes to on this machine, decided once.

The only place where
- the task is chosen (an explicit `task:`, or the first task that reads data.source);
- the model and data sources are decided (a given path wins over a recipe's shape or synthetic
  source; conflicts are refused in one line: sources.py);
- a strategy name becomes degrees on the mesh, a data-parallel wrapper and a sampler
  (strategies.py);
- the speed levers left at auto are decided for this machine, each with its reason (levers.py,
  with what the task declares it knows best: Task.levers);
- settings of different owners are checked against each other, and against what the task
  declares it trains with (checks.py).

The plan is frozen, printed at the start of every run and saved as plan.json in the run folder
(show.py); a launch hands it to its workers as that file, so every rank runs the same plan.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paratrain.config import RunConfig, from_dict
from paratrain.errors import ConfigError, UserError
from paratrain.protocols import Choice, Layout, Task
from paratrain.runplan import checks, cpu, levers, sources, strategies
from paratrain.runplan.sources import DataSource, ModelSource
from paratrain.tasks import get_task, resolve_task


@dataclass(frozen=True)
class RunPlan:
    config: RunConfig
    """The config as it runs: the user's, with the sources decided (a given path's wins) and
    task, strategy and data.sampler made concrete; resolving it again gives this plan."""
    task: str
    strategy: str
    """The shorthand as it applies: `auto` with no degree set becomes single or ddp-*."""
    label: str
    """The strategy named, or for auto the parallelisms its degrees make (fsdp+tp, ...)."""
    layout: Layout
    world_size: int
    nproc: int
    """Processes on this node."""
    multiprocess: bool
    """One process per device, launched through torchrun (else one process here)."""
    device: str
    """cuda or cpu."""
    model: ModelSource
    data: DataSource
    notes: tuple[str, ...] = ()
    """What the plan changed from the recipe, said once at the start of the run."""
    levers: tuple[Choice, ...] = ()
    """Each speed lever as settled: decided here (auto), plain (levers=off) or as set."""
    hints: tuple[str, ...] = ()
    """Faster settings that change the numerics: named with their measured factor, not taken."""

    @property
    def degrees(self) -> dict[str, int]:
        return self.layout.degrees

    @property
    def strategy_doc(self) -> str:
        """What the strategy is, in a line (result.json's strategy_doc)."""
        return strategies.STRATEGIES[self.strategy].doc

    def lines(self, built: dict | None = None) -> list[str]:
        """What rank 0 prints before step 1 (show.py); `built`: counts known once the model
        and data exist."""
        from paratrain.runplan import show

        return show.lines(self, built)

    @property
    def task_spec(self) -> Task:
        """What the task declares (protocols.Task): what the parts after the plan ask of it."""
        return get_task(self.task)

    @property
    def redundant(self) -> bool:
        """ddp-full: every data-parallel rank reads every sample."""
        return self.layout.sampler == "full" and self.layout.dp_size > 1

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["layout"]["uses"] = sorted(self.layout.uses)
        out["notes"] = list(self.notes)
        out["hints"] = list(self.hints)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunPlan:
        layout = {**d["layout"], "uses": frozenset(d["layout"]["uses"])}
        return cls(
            **{
                **d,
                "config": from_dict(RunConfig, d["config"]),
                "layout": Layout(**layout),
                "model": ModelSource(**d["model"]),
                "data": DataSource(**d["data"]),
                "notes": tuple(d["notes"]),
                "levers": tuple(Choice(**c) for c in d.get("levers", ())),
                "hints": tuple(d.get("hints", ())),
            }
        )

    def save(self, path: Path, built: dict | None = None) -> None:
        text = json.dumps({**self.to_dict(), **({"built": built} if built else {})}, indent=1)
        path.write_text(text + "\n")

    @classmethod
    def load(cls, path: str | Path) -> RunPlan:
        d = json.loads(Path(path).read_text())
        d.pop("built", None)
        return cls.from_dict(d)


def resolve(cfg: RunConfig, *, given=(), world: int | None = None, before=()) -> RunPlan:
    """The plan of `cfg` for `world` processes (default: what its launch settings and this
    machine make). `given`: the dotted keys the user set on the command line or in Python,
    whose paths win over the recipe's. `before`: the levers an earlier plan of this run
    decided (a resume of its config.yaml): shown as decided, not as set. A conflict is a
    ConfigError: one line, exit 2."""
    try:
        return _resolve(cfg, frozenset(given), world, tuple(before))
    except UserError:
        raise
    except ValueError as e:
        raise ConfigError(str(e)) from None


def _resolve(cfg: RunConfig, given: frozenset[str], world: int | None, before) -> RunPlan:
    recipe_task = resolve_task(cfg.task, cfg.data.source)
    cfg, notes = sources.with_sources(cfg, given, recipe_task.reads)
    task = resolve_task(cfg.task, cfg.data.source)
    if task.model_keys == "python":
        sources.check_python_objects(cfg)
    sources.check_data(cfg)
    sources.check_model(cfg, task.model_keys, task.name)
    cfg = from_dict(RunConfig, cfg.to_dict())  # the leaves' own checks on what changed
    launches_several = cfg.launch.nproc not in (None, 1) or cfg.launch.nnodes > 1
    strategy, sampler = strategies.shorthand(cfg, launches_several or job_size() > 1)
    strategies.check_shape(cfg, strategy, launches_several)
    checks.check_run(cfg, strategy, replicating(cfg, strategy))
    if cfg.parallel.pp != 1 or strategy == "pipeline":
        checks.check_pipeline(cfg)
    multiprocess = strategy not in strategies.ONE_PROCESS
    nproc, world = world_of(cfg, multiprocess, world)
    asked_strategy = strategy  # what config.yaml keeps: on more ranks it is that again
    strategy, layout_choice = levers.one_process(cfg, strategy, world)
    multiprocess = strategy not in strategies.ONE_PROCESS
    degrees = strategies.degrees_for(cfg, strategy, world)
    checks.check_stages(strategy, degrees, world)
    wrapper = strategies.wrapper_for(strategy, degrees)
    layout = Layout(
        degrees=degrees,
        uses=strategies.uses(strategy, degrees, wrapper),
        wrapper=wrapper,
        sampler=sampler,
        stages_per_rank=stages_per_rank(cfg, degrees["pp"]),
    )
    device = device_of(cfg)
    checks.check_device(cfg, device)
    checks.check_supported(task, layout, strategy, cfg.precision)
    machine = levers.machine_of(device)
    chosen = [layout_choice] if layout_choice else []
    chosen += levers.decide(cfg, task, layout, machine)
    chosen = levers.as_decided_before(chosen, before, given)
    cfg = from_dict(RunConfig, cfg.to_dict())  # the leaves' checks on the levers' values
    checks.check_sync_batchnorm(cfg, wrapper, device)
    checks.check_clipping(cfg, device)
    checks.check_bf16_weights(cfg, layout.uses, task)
    checks.check_compile_scope(cfg, layout.uses, task)
    task.check(cfg, layout)
    notes += checks.unread_settings(cfg, task)
    checks.check_interleaved(cfg, degrees["pp"], task)
    notes += kernel_notes(cfg, task, device)
    notes += cpu.half_precision_notes(cfg, task, device)
    # the decisions written into the config as it runs (config.yaml): resolving it again
    # gives the same plan
    cfg.task, cfg.strategy, cfg.data.sampler = task.name, asked_strategy, sampler
    return RunPlan(
        config=cfg,
        task=task.name,
        strategy=strategy,
        label=strategies.label(strategy, degrees),
        layout=layout,
        world_size=world,
        nproc=nproc,
        multiprocess=multiprocess,
        device=device,
        model=sources.describe_model(cfg, task.model_keys),
        data=sources.describe_data(cfg, task.reads),
        notes=tuple(notes),
        levers=tuple(chosen),
        hints=tuple(levers.hints(cfg, task, machine)),
    )


def kernel_notes(cfg: RunConfig, task: Task, device: str) -> list[str]:
    """paratrain's Triton layers asked for where no GPU runs them: said, not silent."""
    if not task.image_levers or device == "cuda":
        return []
    asked = [
        f"model.{key}=triton"
        for key in ("depthwise_conv", "batchnorm")
        if getattr(cfg.model, key) == "triton"
    ]
    if not asked:
        return []
    return [f"{' and '.join(asked)}: Triton kernels need a GPU; on {device}, PyTorch's arithmetic"]


def plan_of(recipe, overrides: list[str] | None = None, before=()) -> RunPlan:
    """A recipe (or the defaults) with `key=value` overrides, resolved: the overrides' paths
    win over the recipe's; `before`: resolve's."""
    from paratrain.config import load_config, parse_override

    overrides = list(overrides or [])
    given = [parse_override(o)[0] for o in overrides]
    return resolve(load_config(recipe, overrides), given=given, before=before)


def replicating(cfg: RunConfig, strategy: str) -> bool:
    """DDP runs the data-parallel axis: replicas and nothing else."""
    p = cfg.parallel
    return strategy.startswith("ddp") or (
        strategy == "auto" and (p.dp_shard, p.tp, p.pp) == (1, 1, 1)
    )


def stages_per_rank(cfg: RunConfig, pp: int) -> int:
    interleaved = cfg.pipeline.schedule.startswith("interleaved")
    return cfg.pipeline.stages_per_rank if interleaved and pp > 1 else 1


def job_size() -> int:
    """Processes of a job that launched this one (an outside torchrun, or a SLURM step whose
    tasks are the ranks); 1 when paratrain launches its own."""
    from paratrain.launch.torchrun import launched_by_torchrun, slurm_rank_env

    if launched_by_torchrun():
        return int(os.environ.get("WORLD_SIZE", "1"))
    slurm = slurm_rank_env()
    return int(slurm["WORLD_SIZE"]) if slurm else 1


def world_of(cfg: RunConfig, multiprocess: bool, world: int | None) -> tuple[int, int]:
    """-> (processes on this node, processes in the job)."""
    from paratrain.launch.torchrun import default_nproc, launched_by_torchrun, slurm_rank_env

    env = slurm_rank_env() if not launched_by_torchrun() else dict(os.environ)
    if world is None and env and "WORLD_SIZE" in env:
        world = int(env["WORLD_SIZE"])
        return int(env.get("LOCAL_WORLD_SIZE", world)), world
    if world is not None:
        return min(world, cfg.launch.nproc or world), world
    if not multiprocess:
        return 1, 1
    nproc = cfg.launch.nproc or default_nproc(True)
    return nproc, nproc * cfg.launch.nnodes


def device_of(cfg: RunConfig) -> str:
    import torch

    return "cuda" if cfg.device != "cpu" and torch.cuda.is_available() else "cpu"
