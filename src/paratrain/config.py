"""RunConfig: the owners' small configs composed, loaded from YAML with dotted overrides.

Each concern keeps its config beside its code (data/loader.py has DataConfig, precision.py has
ScalerConfig, ...). This module composes them, turns YAML and ``--set key=value`` strings into
typed values, and is the one place where a config is validated: every check either lives in a
dataclass's ``__post_init__`` (one field or one owner) or in ``RunConfig.__post_init__`` (across
owners). A mistake becomes a ``ConfigError``: one line naming the field, the bad value and what
is accepted, which the CLI prints without a traceback and exits with code 2.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import inspect
import math
import os
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from paratrain.data.loader import DataConfig
from paratrain.distributed.parallel_dims import ParallelConfig
from paratrain.distributed.process_group import DistConfig
from paratrain.errors import ConfigError
from paratrain.launch import LaunchConfig
from paratrain.models import ModelConfig
from paratrain.models.causal_lm.lora import LoraConfig
from paratrain.parallel import ONE_PROCESS, STRATEGIES, Strategy
from paratrain.parallel.ddp import DDPConfig
from paratrain.parallel.pipeline import PipelineConfig
from paratrain.parallel.split import SplitConfig
from paratrain.parallel.sync import SyncConfig
from paratrain.precision import Precision, ScalerConfig
from paratrain.tasks import resolve_task, task_module
from paratrain.tasks.gan import GanConfig
from paratrain.trainer.checkpoint import CheckpointConfig
from paratrain.trainer.config import LogConfig, TrainConfig


@dataclass(kw_only=True)
class RunConfig:
    name: str = "run"
    """Run name; used in the default output directory and in reports."""
    task: Literal[
        "auto",
        "image_classification",
        "causal_lm",
        "masked_lm",
        "text_classification",
        "gan",
        "custom",
    ] = "auto"
    """What is trained (a task owns its data, loss and metrics): image_classification,
    causal_lm, masked_lm (BERT-style), text_classification, gan (a generator and a
    discriminator, two optimizers); auto picks by data.source. custom: the model, data sets and
    loss given to paratrain.train from Python (tasks/custom.py)."""
    strategy: Strategy = "auto"
    """A shorthand for parallel.* degrees and data.sampler: single, dp, ddp-full, ddp-rr, ddp-ds,
    fsdp, tp, pipeline, split (see README); auto lets the degrees decide (one process, or ddp-ds
    for launch.nproc > 1, when none is set)."""
    precision: Precision = "fp32"
    """Arithmetic: fp64, fp32 (IEEE), tf32 (CUDA tensor cores), fp16 (autocast + GradScaler), bf16 (autocast)."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """auto takes CUDA when a GPU is visible, else the CPU (gloo for several processes)."""
    seed: int = 0
    """Seed for weights, shuffling and dropout; equal on every rank."""
    output_dir: str | None = None
    """Where result.json, config.yaml and checkpoints go; default runs/<name>-<time>."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    scaler: ScalerConfig = field(default_factory=ScalerConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    ddp: DDPConfig = field(default_factory=DDPConfig)
    sync: SyncConfig = field(default_factory=SyncConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    split: SplitConfig = field(default_factory=SplitConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    log: LogConfig = field(default_factory=LogConfig)
    gan: GanConfig = field(default_factory=GanConfig)

    def __post_init__(self) -> None:
        self.task = resolve_task(self.task, self.data.source)
        self._apply_strategy()
        if self.precision == "tf32" and self.device == "cpu":
            raise ValueError(
                "precision: tf32 is a CUDA tensor-core mode, got device=cpu; use fp32 or bf16"
            )
        p = self.parallel
        # DDP runs where data_parallel_wrapper picks it: replicas and nothing else
        replicating = self.strategy.startswith("ddp") or (
            self.strategy == "auto" and (p.dp_shard, p.tp, p.pp) == (1, 1, 1)
        )
        if self.ddp.gradient_compression != "none" and not replicating:
            raise ValueError(
                f"ddp.gradient_compression: compresses DDP's all-reduce; strategy "
                f"{self.strategy} has none (use ddp-ds, ddp-rr or ddp-full)"
            )
        if self.sync.mode != "every_step":
            if not replicating or self.strategy == "ddp-full":
                raise ValueError(
                    f"sync.mode: {self.sync.mode} changes how DDP's replicas agree; strategy "
                    f"{self.strategy} has none that train apart (use ddp-ds or ddp-rr)"
                )
            if self.precision == "fp16":
                raise ValueError(
                    f"sync.mode: {self.sync.mode} keeps gradients off DDP's all-reduce, so each "
                    "rank's fp16 loss scale would drift on its own (and stale-1 would apply "
                    "gradients scaled by an older one); use bf16 or fp32"
                )
            if self.sync.mode == "stale" and self.ddp.gradient_compression != "none":
                raise ValueError(
                    "sync.mode: stale runs its own fp32 all-reduce, which "
                    "ddp.gradient_compression does not compress; set one of them"
                )
        if self.sync.simulated_gbps:
            if not replicating:
                raise ValueError(
                    f"sync.simulated_gbps: delays DDP's gradient collectives; strategy "
                    f"{self.strategy} has none (use ddp-ds or ddp-rr)"
                )
            if self.ddp.gradient_compression == "powersgd":
                raise ValueError(
                    "sync.simulated_gbps: PowerSGD's bytes are not counted, so no delay can be "
                    "derived from them; use none, fp16, bf16 or int8"
                )
        if p.cpu_offload and not (self.strategy == "fsdp" or p.dp_shard != 1):
            raise ValueError(
                f"parallel.cpu_offload: moves FSDP's shards to host memory; strategy "
                f"{self.strategy} has none (use strategy=fsdp, on one GPU too)"
            )
        sharded = self.strategy == "fsdp" or p.dp_shard != 1 or p.tp != 1 or p.pp != 1
        if self.lora.save_merged and sharded:
            raise ValueError(
                "lora.save_merged: merging needs whole weights on one rank; use ddp-ds, or merge "
                "later"
            )
        if p.pp != 1:
            self._check_pipeline()
        task_module(self.task).check(self)

    @property
    def multiprocess(self) -> bool:
        """Runs one process per device, launched through torchrun."""
        return self.strategy not in ONE_PROCESS

    def _apply_strategy(self) -> None:
        """The strategy shorthand -> degrees and sampler, filling only what was left at its
        default (so it can be applied again to its own output: config.yaml)."""
        p, short = self.parallel, STRATEGIES[self.strategy]
        nproc, nnodes = self.launch.nproc, self.launch.nnodes
        launches_several = nproc not in (None, 1) or nnodes > 1
        several = launches_several or _job_size() > 1
        trivial = p.dp_replicate in (None, 1) and (p.dp_shard, p.tp, p.pp) == (1, 1, 1)
        if self.strategy == "auto" and trivial:
            by_sampler = {"full": "ddp-full", "round-robin": "ddp-rr"}
            self.strategy = by_sampler.get(self.data.sampler, "ddp-ds") if several else "single"
            short = STRATEGIES[self.strategy]
        if self.data.sampler == "auto":
            self.data.sampler = short.sampler
        elif short.wrapper == "ddp" and self.data.sampler != short.sampler:
            raise ValueError(
                f"data.sampler: strategy {self.strategy} reads with the {short.sampler} "
                f"sampler, got {self.data.sampler}; leave data.sampler at auto"
            )
        if self.strategy in ONE_PROCESS:
            if launches_several:
                raise ValueError(
                    f"launch.nproc: strategy {self.strategy} runs in one process, got "
                    f"nproc={nproc} nnodes={nnodes}; use ddp-ds (or ddp-rr, ddp-full) for several"
                )
            if not trivial:
                raise ValueError(
                    f"strategy: {self.strategy} runs in one process; the parallel.* degrees set "
                    f"({_set_degrees(p)}) need several (strategy auto lets them decide)"
                )
            return
        if short.wrapper == "ddp" and (p.dp_shard != 1 or p.tp != 1 or p.pp != 1):
            raise ValueError(
                f"strategy: {self.strategy} replicates whole models (DDP), which holds no sharded "
                f"or tensor-parallel weights and no pipeline schedule ({_set_degrees(p)}); use "
                "strategy=auto (replicas then come from FSDP2) or fsdp"
            )
        inferred = any(v == -1 for v in p.degrees().values())
        # this axis takes the ranks the others leave (dp_replicate's null already does)
        axis = short.axis
        if axis not in (None, "dp_replicate") and not inferred and getattr(p, axis) == 1:
            setattr(p, axis, -1)

    def _check_pipeline(self) -> None:
        """What a pipeline does not do (yet): one line each, before anything runs."""
        mb = self.pipeline.microbatches
        if self.train.compile:
            raise ValueError(
                "train.compile: not with strategy=pipeline yet (parallel.pp > 1); set it false"
            )
        if self.precision == "fp16":
            raise ValueError(
                "precision: fp16's loss scaling is not wired through pipeline stages; use bf16"
            )
        if self.train.grad_accum_steps > 1:
            raise ValueError(
                "train.grad_accum_steps: a pipeline accumulates over its micro-batches already; "
                "set pipeline.microbatches instead"
            )
        if self.data.batch_size % mb:
            raise ValueError(
                f"pipeline.microbatches: data.batch_size {self.data.batch_size} does not divide "
                f"into {mb} equal micro-batches"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _job_size() -> int:
    """Processes of a job that launched this one (an outside torchrun, or a SLURM step whose
    tasks are the ranks); 1 when paratrain launches its own."""
    from paratrain.launch import launched_by_torchrun, slurm_rank_env

    if launched_by_torchrun():
        return int(os.environ.get("WORLD_SIZE", "1"))
    slurm = slurm_rank_env()
    return int(slurm["WORLD_SIZE"]) if slurm else 1


def _set_degrees(p: ParallelConfig) -> str:
    return ", ".join(f"{k}={v}" for k, v in p.degrees().items() if v not in (None, 1)) or "none"


# --------------------------------------------------------------------------- loading


def load_config(recipe: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Recipe YAML (optional) + ``key=value`` overrides -> validated RunConfig."""
    raw: dict[str, Any] = {}
    if recipe is not None:
        raw = read_yaml(recipe)
        raw.setdefault("name", Path(recipe).stem)
    for item in overrides or []:
        key, value = parse_override(item)
        set_dotted(raw, key, value)
    return from_dict(RunConfig, raw)


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"recipe: file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ConfigError(f"recipe: {p} is not valid YAML{where}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"recipe: {p} must hold a mapping of keys, got {type(data).__name__}")
    return data


def parse_override(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ConfigError(f"--set: expected key=value, got {item!r}")
    key, text = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set: empty key in {item!r}")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    return key, value


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(
                f"{'.'.join(parts[: i + 1])}: is a value, not a group; cannot set {key}"
            )
        node = child
    node[parts[-1]] = value


def from_dict(cls: type, raw: Any, prefix: str = "") -> Any:
    """Build dataclass ``cls`` from plain data, coercing and checking every field."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{prefix.rstrip('.') or 'config'}: expected a group of keys, got {raw!r}"
        )
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            accepted = ", ".join(sorted(fields))
            raise ConfigError(f"{prefix}{key}: unknown key; accepted keys: {accepted}")
        kwargs[key] = _coerce(value, hints[key], f"{prefix}{key}")
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:
        msg = str(e)
        # Owners name their own fields ("batch_size: ..."); cross-owner checks name full paths.
        if msg.split(":", 1)[0] in fields:
            msg = f"{prefix}{msg}"
        raise ConfigError(msg) from None


def _coerce(value: Any, tp: Any, name: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return from_dict(tp, value if value is not None else {}, f"{name}.")
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        is_null = value is None or (isinstance(value, str) and value.lower() in ("none", "null"))
        if is_null and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, name)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{name}: {value!r} is not accepted")
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        raise ConfigError(f"{name}: got {value!r}; accepted: {', '.join(map(str, choices))}")
    if origin is dict:
        # A group of free-form settings (train.compile_options); nested groups become dotted names,
        # so `--set train.compile_options.triton.cudagraphs=true` names the setting triton.cudagraphs.
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a group of settings, got {value!r}")
        return _flatten(value)
    if origin in (list, tuple):
        (inner, *_) = typing.get_args(tp) or (str,)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: expected a list, got {value!r}")
        items = [_coerce(v, inner, f"{name}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "on", "off"):
            return value.lower() in ("true", "yes", "on")
        raise ConfigError(f"{name}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    if tp is float:
        number = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None:
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        if not math.isfinite(number):  # nan / inf would pass every "> 0" check after this
            raise ConfigError(f"{name}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{name}: expected a string, got {value!r}")
    raise AssertionError(f"unsupported config type {tp} for {name}")


def _flatten(group: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in group.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# --------------------------------------------------------------------------- output


def to_yaml(cfg: RunConfig) -> str:
    return yaml.safe_dump(_plain(cfg.to_dict()), sort_keys=False)


def _plain(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def describe_keys(cls: type = RunConfig, prefix: str = "") -> list[tuple[str, str, str]]:
    """(dotted key, default, docstring) for every leaf field: the text of ``--list-keys``."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            rows += describe_keys(tp, f"{prefix}{f.name}.")
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        rows.append((f"{prefix}{f.name}", repr(default), docs.get(f.name, "")))
    return rows


def for_task(config: dict[str, Any], task: str) -> dict[str, Any]:
    """A resolved config's dict without the keys of the other task (lora.* and model.shape on
    an image run, model.name and data.image_size on a language model's): what result.json
    records, so that it reads as the run it describes."""
    from paratrain.data import loader
    from paratrain.models import IMAGE_ONLY, LM_ONLY

    lm = task in ("causal_lm", "masked_lm", "text_classification")
    drop = {
        "model": IMAGE_ONLY if lm else LM_ONLY,
        "data": loader.IMAGE_ONLY if lm else loader.TEXT_ONLY,
    }
    if task == "custom":  # the objects came from Python: no model or data source is read
        drop["data"] = (*loader.IMAGE_ONLY, *loader.TEXT_ONLY, "source", "path", "limit_samples")
    if task in ("masked_lm", "text_classification"):  # BERT: no LoRA, Liger, fp8 or packing
        drop["model"] = (*IMAGE_ONLY, "kernels", "fp8", "loss_chunk_tokens")
        drop["data"] = (*loader.IMAGE_ONLY, "packing")
    gone = {"lora", "model"} if task == "custom" else set() if task == "causal_lm" else {"lora"}
    if task != "gan":
        gone = gone | {"gan"}
    out = {k: v for k, v in config.items() if k not in gone}
    for section, keys in drop.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return out


def field_docs(cls: type) -> dict[str, str]:
    """Docstrings written under each field (the house style) read back from the source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = {}
    for node, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs
