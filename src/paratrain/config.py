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
import dataclasses
import inspect
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from paratrain.checkpoint import CheckpointConfig
from paratrain.data.loader import TEXT_SOURCES, DataConfig
from paratrain.errors import ConfigError
from paratrain.launch import LaunchConfig
from paratrain.lm.model import LoraConfig
from paratrain.models import ModelConfig
from paratrain.parallel import STRATEGIES, Strategy
from paratrain.parallel.data_parallel import DDPConfig
from paratrain.parallel.pipeline import PipelineConfig
from paratrain.precision import Precision, ScalerConfig
from paratrain.train_config import LogConfig, TrainConfig


@dataclass(kw_only=True)
class RunConfig:
    name: str = "run"
    """Run name; used in the default output directory and in reports."""
    strategy: Strategy = "single"
    """How the work is spread: single, dp, ddp-full, ddp-rr, ddp-ds, fsdp, pipeline (see README)."""
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
    ddp: DDPConfig = field(default_factory=DDPConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    log: LogConfig = field(default_factory=LogConfig)

    def __post_init__(self) -> None:
        spec = STRATEGIES[self.strategy]
        nproc = self.launch.nproc
        if not spec.multiprocess and (self.launch.nnodes > 1 or (nproc not in (None, 1))):
            raise ValueError(
                f"launch.nproc: strategy {self.strategy} runs in one process, got nproc={nproc}"
                f" nnodes={self.launch.nnodes}; use ddp-ds (or ddp-rr, ddp-full) for several"
            )
        if self.data.source in TEXT_SOURCES:
            if self.model.path is None and self.model.init != "random":
                raise ValueError(
                    "model.path: a text data set fine-tunes a language model; set model.path to a "
                    "Hugging Face checkpoint, or model.init=random with model.shape"
                )
            if self.strategy == "dp":
                raise ValueError(
                    "strategy: dp is for image models; use ddp-ds or fsdp for language models"
                )
        if self.model.loss_chunk_tokens and "lm_head" in self.lora.target_modules:
            raise ValueError(
                "model.loss_chunk_tokens: the chunked loss uses lm_head's weight directly; "
                "drop lm_head from lora.target_modules or set loss_chunk_tokens=0"
            )
        if self.lora.save_merged and self.strategy == "fsdp":
            raise ValueError(
                "lora.save_merged: merging needs whole weights on one rank; use ddp-ds, or merge later"
            )
        if self.data.resize_on == "gpu" and self.device == "cpu":
            raise ValueError("data.resize_on: gpu needs a CUDA device, got device=cpu; use cpu")
        if self.precision == "tf32" and self.device == "cpu":
            raise ValueError(
                "precision: tf32 is a CUDA tensor-core mode, got device=cpu; use fp32 or bf16"
            )
        if self.ddp.gradient_compression != "none" and not self.strategy.startswith("ddp"):
            raise ValueError(
                f"ddp.gradient_compression: compresses DDP's all-reduce; strategy "
                f"{self.strategy} has none (use ddp-ds, ddp-rr or ddp-full)"
            )
        if self.strategy == "pipeline":
            self._check_pipeline()
        if self.model.depthwise_conv == "shift-add" and not self.train.compile:
            raise ValueError(
                "model.depthwise_conv: shift-add is written for torch.compile to fuse (eagerly "
                "it is slower than native); set train.compile=true"
            )

    def _check_pipeline(self) -> None:
        """What strategy=pipeline does not do (yet): one line each, before anything runs."""
        mb = self.pipeline.microbatches
        if self.data.source in TEXT_SOURCES:
            raise ValueError("strategy: pipeline cuts image models; use ddp-ds or fsdp for text")
        if self.train.compile:
            raise ValueError("train.compile: not with strategy=pipeline yet; set it false")
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
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{name}: expected a number, got {value!r}")
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
