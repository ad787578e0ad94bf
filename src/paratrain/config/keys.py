"""A config as text: the YAML a run folder keeps (config.yaml), the rows of `--list-keys` (each
key, its default and the docstring under its field), and the keys result.json shows for a task."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from typing import Any

import yaml

from paratrain.config import data, model
from paratrain.config.run import RunConfig


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


def all_keys(cls: type = RunConfig) -> list[str]:
    return [key for key, _, _ in describe_keys(cls)]


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


def dotted(section: str, keys: tuple[str, ...]) -> tuple[str, ...]:
    """("model", ("name", "kwargs")) -> ("model.name", "model.kwargs"): a task's Task.unread."""
    return tuple(f"{section}.{k}" for k in keys)


# The keys each kind of task leaves unread, for the tasks' Task.unread (config/model.py and
# data.py say which keys are an image model's or a language model's)
IMAGE_UNREAD = (*dotted("model", model.LM_ONLY), *dotted("data", data.TEXT_ONLY))
LM_UNREAD = (*dotted("model", model.IMAGE_ONLY), *dotted("data", data.IMAGE_ONLY))


def for_task(config: dict[str, Any], unread: tuple[str, ...]) -> dict[str, Any]:
    """A resolved config's dict without the keys its task never reads (`unread`, the task's
    Task.unread: lora.* and model.shape on an image run, model.name and data.image_size on a
    language model's): what result.json records, so that it reads as the run it describes."""
    gone = {u for u in unread if "." not in u}
    drop: dict[str, set[str]] = {}
    for key in unread:
        if "." in key:
            section, name = key.split(".", 1)
            drop.setdefault(section, set()).add(name)
    out = {k: v for k, v in config.items() if k not in gone}
    for section, keys in drop.items():
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if k not in keys}
    return out
