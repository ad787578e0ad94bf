"""A recipe (YAML) plus `--set dotted.key=value` overrides -> a RunConfig, parsed and checked
by pydantic.

pydantic validates the plain dataclasses of config/ as they are (TypeAdapter): it coerces the
strings of `--set` and YAML to each field's type, refuses unknown keys and non-finite numbers,
and runs each dataclass's __post_init__ (the owner's own checks). What it reports becomes one
line naming the dotted key, the value and what is accepted (ConfigError: exit code 2), with a
"did you mean" for a misspelt key or choice. Before pydantic sees a value, _normalise gives
the command line's shortcuts their meaning: `a,b` for a list, `none` for null, nested groups
of free-form settings as dotted names.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from paratrain.config.run import RunConfig
from paratrain.errors import ConfigError


def load_config(recipe: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """Recipe YAML (optional) + ``key=value`` overrides -> a validated RunConfig."""
    raw = recipe_dict(recipe)
    for item in overrides or []:
        key, value = parse_override(item)
        set_dotted(raw, key, value)
    return from_dict(RunConfig, raw)


def recipe_dict(recipe: str | Path | None) -> dict[str, Any]:
    """A recipe's keys, with its file name as the run's default name."""
    if recipe is None:
        return {}
    raw = read_yaml(recipe)
    raw.setdefault("name", Path(recipe).stem)
    return raw


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


def from_dict(cls: type, raw: Any) -> Any:
    """Build the config dataclass ``cls`` from plain data: coerced, checked, one line if not."""
    import pydantic

    if not isinstance(raw, dict):
        raise ConfigError(f"config: expected a group of keys, got {raw!r}")
    try:
        return _adapter(cls).validate_python(_normalise(cls, raw, ""))
    except pydantic.ValidationError as e:
        raise ConfigError(error_line(cls, e.errors()[0])) from None


@functools.cache
def _adapter(cls: type):
    import pydantic

    rules = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False, coerce_numbers_to_str=True)
    for group in _groups(cls):  # every group of keys parses by the same rules
        group.__pydantic_config__ = rules
    return pydantic.TypeAdapter(cls)


def _groups(cls: type) -> list[type]:
    nested = [t for t in typing.get_type_hints(cls).values() if dataclasses.is_dataclass(t)]
    return [cls, *(g for t in nested for g in _groups(t))]


# --------------------------------------------------------------------------- the shortcuts


def _normalise(cls: type, raw: dict[str, Any], prefix: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {k: _shortcut(v, hints[k], f"{prefix}{k}") if k in hints else v for k, v in raw.items()}


def _shortcut(value: Any, tp: Any, name: str) -> Any:
    if dataclasses.is_dataclass(tp):  # a group: `data:` with nothing under it is its defaults
        if value is None:
            return {}
        return _normalise(tp, value, f"{name}.") if isinstance(value, dict) else value
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        if isinstance(value, str) and value.lower() in ("none", "null"):
            return None
        (tp,) = [a for a in args if a is not type(None)]
    origin = typing.get_origin(tp)
    if origin is list and isinstance(value, str):  # --set lora.target_modules=q_proj,v_proj
        return [v.strip() for v in value.split(",") if v.strip()]
    if origin is dict:
        # free-form settings (train.compile_options, model.kwargs): nested groups become dotted
        # names, so `--set train.compile_options.triton.cudagraphs=true` sets triton.cudagraphs
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: expected a group of settings, got {value!r}")
        return _flatten(value)
    return value


def _flatten(group: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in group.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# --------------------------------------------------------------------------- one line


EXPECTED = {
    "bool_parsing": "expected true or false",
    "bool_type": "expected true or false",
    "int_parsing": "expected an integer",
    "int_type": "expected an integer",
    "int_from_float": "expected an integer",
    "float_parsing": "expected a number",
    "float_type": "expected a number",
    "finite_number": "expected a finite number",
    "string_type": "expected a string",
    "list_type": "expected a list",
    "dataclass_type": "expected a group of keys",
    "dict_type": "expected a group of settings",
}


def error_line(cls: type, err: dict) -> str:
    """pydantic's first error as paratrain's line: `data.batch_size: expected an integer, got
    'big'`."""
    path = [str(x) for x in err["loc"]]
    # a list's item is key[i], as it was written
    key = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err["loc"]).lstrip(".")
    kind, value = err["type"], err.get("input")
    if kind == "value_error":  # an owner's __post_init__ names its own field
        message = str(err["ctx"]["error"])
        return f"{key}.{message}" if key else message
    if kind in ("unexpected_keyword_argument", "extra_forbidden"):
        known = _field_names(cls, path[:-1])
        word = path[-1]
        exact = f"; did you mean {ALIASES[word]}? ({word} elsewhere)" if word in ALIASES else ""
        hint = exact or _did_you_mean(word, known) or _elsewhere(cls, path)
        return f"{key}: unknown key{hint}; accepted keys: " + ", ".join(sorted(known))
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", err["ctx"]["expected"])
        hint = _did_you_mean(str(value), choices) if isinstance(value, str) else ""
        return f"{key}: got {value!r}; accepted: {', '.join(choices)}{hint}"
    if kind in EXPECTED:
        return f"{key}: {EXPECTED[kind]}, got {value!r}"
    return f"{key}: {err['msg']}, got {value!r}"


# What other tools (HF Trainer, Lightning, torchtitan, nanoGPT, peft) call a setting, and
# paratrain's key for it: a key from there, or misspelt like one, is pointed here.
ALIASES = {
    "learning_rate": "train.lr",
    "num_epochs": "train.epochs",
    "num_train_epochs": "train.epochs",
    "max_epochs": "train.epochs",
    "epoch": "train.epochs",
    "steps": "train.max_steps",
    "max_iters": "train.max_steps",
    "per_device_train_batch_size": "data.batch_size",
    "train_batch_size": "data.batch_size",
    "micro_batch_size": "data.batch_size",
    "local_batch_size": "data.batch_size",
    "gradient_accumulation_steps": "train.grad_accum_steps",
    "accumulate_grad_batches": "train.grad_accum_steps",
    "gradient_checkpointing": "train.activation_checkpointing",
    "optim": "train.optimizer",
    "lr_scheduler_type": "train.lr_schedule",
    "lr_scheduler": "train.lr_schedule",
    "scheduler": "train.lr_schedule",
    "clip_grad_norm": "train.max_grad_norm",
    "gradient_clip_val": "train.max_grad_norm",
    "max_norm": "train.max_grad_norm",
    "torch_compile": "train.compile",
    "dataloader_num_workers": "data.num_workers",
    "dataloader_pin_memory": "data.pin_memory",
    "max_seq_length": "data.max_length",
    "seq_len": "data.max_length",
    "block_size": "data.max_length",
    "model_name_or_path": "model.path",
    "lora_r": "lora.r",
    "rank": "lora.r",
    "lora_alpha": "lora.alpha",
    "lora_dropout": "lora.dropout",
    "bf16": "precision (precision=bf16)",
    "fp16": "precision (precision=fp16)",
    "mixed_precision": "precision",
    "num_gpus": "launch.nproc",
    "nproc_per_node": "launch.nproc",
    "devices": "launch.nproc",
}


def _elsewhere(cls: type, path: list[str]) -> str:
    """A key of another group (train.batch_size: data.batch_size), or close to another tool's
    name for a setting (lerning_rate: train.lr)."""
    word = path[-1]
    groups = [f.name for f in dataclasses.fields(cls) if dataclasses.is_dataclass(_hint(cls, f))]
    others = [g for g in groups if [g] != path[:-1]]
    for cutoff in (1.0, None):  # the same name in another group first, then a close one
        for group in others:
            names = _field_names(cls, [group])
            found = [word] if word in names else []
            if cutoff is None:
                found = difflib.get_close_matches(word, names, 1, 0.85)
            if found:
                return f"; did you mean {group}.{found[0]}?"
        close = difflib.get_close_matches(word, list(ALIASES), n=1, cutoff=0.8)
        if cutoff is None and close:
            return f"; did you mean {ALIASES[close[0]]}? ({close[0]} elsewhere)"
    return ""


def _hint(cls: type, f: dataclasses.Field) -> Any:
    return typing.get_type_hints(cls)[f.name]


def _field_names(cls: type, path: list[str]) -> list[str]:
    for part in path:
        cls = typing.get_type_hints(cls)[part]
    return [f.name for f in dataclasses.fields(cls)]


def _did_you_mean(word: str, choices: list[str]) -> str:
    """The choices the word begins (ddp: ddp-full, ddp-rr, ddp-ds), else the closest one."""
    starting = [c for c in choices if c.startswith(word) and c != word]
    close = starting or difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f"; did you mean {' or '.join(close)}?" if close else ""
