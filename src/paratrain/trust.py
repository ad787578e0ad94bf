"""Code a config names runs only when the user says so (transformers' `trust_remote_code`).

`model.name: module.path:function` imports the module and calls the function. A recipe or a run
folder's config.yaml is a file people hand each other: `model.name: os:system` with
`model.kwargs: {command: ...}` would run a shell command on `paratrain run --resume DIR`. So a
module is imported only when it is the user's own file (not Python's standard library, not an
installed package, not paratrain itself, not inside a run folder, whose files are handed
around as data), or with --trust-code / paratrain.train(trust_code=True). Where the module lies
is found without importing anything (a top-level name's spec: the finders only look).

A config read from a run folder (`paratrain run --resume DIR`, `paratrain run DIR/config.yaml`,
`paratrain.train(recipe="DIR/config.yaml")`, `paratrain export`) may have come with the folders
around it (an archive `experiment/{run/, models.py}` unpacked into the
user's home): a module under any folder above it that is not also above the working directory
is the handed bundle's, not the user's (CONFIG_FOLDER_ENV names the config's folder). What lies
in the working directory itself counts as the user's own: code in the folder you run from is
yours.

The same flag decides what else a config may hand to code that runs: transformers'
`trust_remote_code` for a Hugging Face folder's own modules (auto_map), and the string or list
settings of train.compile_options (a compiler command, a path).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import site
import sysconfig
from pathlib import Path

from paratrain.errors import UserError

TRUST_ENV = "PARATRAIN_TRUST_CODE"
"""Set to 1 by --trust-code (and by trust_code=True for the call): a launch's workers inherit
it. A config cannot set it."""

CONFIG_FOLDER_ENV = "PARATRAIN_CONFIG_FOLDER"
"""The folder the run's config was read from, where that is a run folder (set by `paratrain run
--resume` and `paratrain export`; a launch's workers inherit it)."""

_RUN_FOLDER = ("plan.json", "result.json", "steps.jsonl", "checkpoints")
_LEDGER = ".paratrain"  # the files a run wrote (runfolder): only a run folder has one


def trusted() -> bool:
    return os.environ.get(TRUST_ENV) == "1"


def check(module_name: str, key: str = "model.name") -> None:
    """Refuses, in one line naming what the config asks to import and the flag, a module that
    is not the user's own file unless the user trusts the config's code."""
    if trusted():
        return
    why = not_own(module_name)
    if why:
        raise UserError(
            f"{key}: the config asks to import {module_name} ({why}) and call a function of it; "
            "paratrain runs code a recipe or config names only when you say so: --trust-code "
            "(paratrain.train(..., trust_code=True))"
        )


def not_own(module_name: str) -> str | None:
    """Why the module is not the user's own file, or None when it is."""
    top = module_name.split(".")[0]
    # a top-level name's spec: the finders look, nothing is executed (a dotted name's would
    # import its parents)
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None  # the import's own error says so
    if spec is None:
        return None
    if spec.origin in ("built-in", "frozen"):
        return "built into Python"
    where = spec.origin or next(iter(spec.submodule_search_locations or ()), None)
    if where is None:
        return "no file"
    path = Path(where).resolve()
    for folder, what in _installed():
        if path.is_relative_to(folder):
            return f"{what}, {path}"
    run = next((p for p in path.parents if _is_run_folder(p)), None)
    if run is not None:
        return f"a file inside the run folder {run}"
    beside = _beside_config(path)
    if beside is not None:
        return f"a file under {beside}, which holds the run folder its config came from"
    return None


@contextlib.contextmanager
def reading_config_of(folder: str | Path | None):
    """config_from(folder) inside, as it was outside."""
    before = os.environ.get(CONFIG_FOLDER_ENV)
    config_from(folder)
    try:
        yield
    finally:
        config_from(before)


def run_folder_of(config_path: str | Path) -> Path | None:
    """The run folder a config file lies in (a run's own config.yaml, however it is named on
    the command line or to paratrain.train), or None for a recipe that lies in no run folder."""
    folder = Path(config_path).resolve().parent
    return folder if _is_run_folder(folder) else None


def config_from(folder: str | Path | None) -> None:
    """The run's config is read from `folder` (a run folder), or from no run folder (None):
    what not_own compares a module's place with, here and in the workers."""
    if folder is None:
        os.environ.pop(CONFIG_FOLDER_ENV, None)
    else:
        os.environ[CONFIG_FOLDER_ENV] = str(Path(folder).resolve())


def _beside_config(path: Path) -> Path | None:
    """The highest folder above the config's run folder (itself included) that holds `path` and
    is not the working directory or above it; None where there is none."""
    given = os.environ.get(CONFIG_FOLDER_ENV)
    if not given:
        return None
    folder, here = Path(given).resolve(), Path.cwd().resolve()
    found = None
    for above in (folder, *folder.parents):
        if here.is_relative_to(above):  # the working directory's own folders, and those above
            break
        if path.is_relative_to(above):
            found = above
    return found


def _installed() -> list[tuple[Path, str]]:
    """The folders whose modules are not the user's: the standard library, installed packages
    (site-packages, the user's site), paratrain's own package."""
    paths = sysconfig.get_paths()
    sites = [paths.get("purelib"), paths.get("platlib"), *site.getsitepackages()]
    # site-packages first: it lies inside the standard library's folder
    found = [(s, "an installed package") for s in [*sites, site.getusersitepackages()]]
    found += [(paths.get(k), "Python's standard library") for k in ("stdlib", "platstdlib")]
    found.append((str(Path(__file__).resolve().parent), "paratrain's own code"))
    return [(Path(p).resolve(), what) for p, what in found if p]


def _is_run_folder(folder: Path) -> bool:
    if (folder / _LEDGER).is_dir():
        return True
    return (folder / "config.yaml").is_file() and any(
        (folder / name).exists() for name in _RUN_FOLDER
    )


def remote_code(error: Exception, key: str, path) -> UserError | None:
    """transformers' refusal of a Hugging Face folder's own code (trust_remote_code=False on a
    config with auto_map) as one line naming the flag; None for any other error."""
    if "trust_remote_code" not in str(error):
        return None
    return UserError(
        f"{key}: {path} asks to run code of its own (auto_map in its config: modules shipped "
        "with the model); paratrain runs code a model folder names only when you say so: "
        "--trust-code (paratrain.train(..., trust_code=True))"
    )
