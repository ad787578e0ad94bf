"""Code a config names runs only when the user says so (transformers' `trust_remote_code`).

`model.name: module.path:function` imports the module and calls the function. A recipe or a run
folder's config.yaml is a file people hand each other: `model.name: os:system` with
`model.kwargs: {command: ...}` would run a shell command on `paratrain run --resume DIR`. So a
module is imported only when it is the user's own file (not Python's standard library, not an
installed package, not paratrain itself, not inside a run folder, whose files are handed
around as data), or with --trust-code / paratrain.train(trust_code=True). Where the module lies
is found without importing anything (a top-level name's spec: the finders only look).
"""

from __future__ import annotations

import importlib.util
import os
import site
import sysconfig
from pathlib import Path

from paratrain.errors import UserError

TRUST_ENV = "PARATRAIN_TRUST_CODE"
"""Set to 1 by --trust-code (and by trust_code=True for the call): a launch's workers inherit
it. A config cannot set it."""

_RUN_FOLDER = ("plan.json", "result.json", "steps.jsonl", "checkpoints")


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
    return None


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
    return (folder / "config.yaml").is_file() and any(
        (folder / name).exists() for name in _RUN_FOLDER
    )
