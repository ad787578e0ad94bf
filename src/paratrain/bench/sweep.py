"""A sweep: a base recipe, common overrides, a grid of axes (strategy x nproc x precision x any
key), optional variants (other programs or option sets), repeats. Expanded into runs, each with
a key derived from what it computes, so a re-run knows what is already done.

```yaml
name: seed_dp_modes
recipe: ../mnist_sample_mobilenetv2.yaml   # relative to this file
table: dp_modes                            # report layout: dp_modes, precision, pin_memory, variants, plain
set: {train.max_steps: 60}                 # for every run
grid: {strategy: [ddp-full, ddp-rr, ddp-ds], launch.nproc: [1, 2]}
variants:                                  # optional; each is crossed with the grid
  - {label: paratrain seed-style, set: {precision: fp16}}
  - {label: plain PyTorch, program: plain, set: {precision: fp16}}
  - {label: speed of light, program: sol, grid: {launch.nproc: [1]}}
repeats: 1
timeout_s: 900
```
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paratrain.config import RunConfig, load_config, parse_override, read_yaml
from paratrain.errors import ConfigError
from paratrain.runplan import resolve

PROGRAMS = (
    "paratrain",
    "plain",
    "accelerate",
    "fabric",
    "sol",
    "hf_lora",
    "torchtitan",
    "unsloth_lora",
)
TABLES = ("dp_modes", "precision", "pin_memory", "variants", "llm", "sync", "plain")
_KEYS = {
    "name",
    "recipe",
    "table",
    "set",
    "grid",
    "variants",
    "repeats",
    "timeout_s",
    "reference",
    "notes",
}


@dataclass
class RunSpec:
    sweep: str
    label: str
    program: str
    params: dict[str, Any]
    """The grid point and variant settings that distinguish this run (for the report)."""
    overrides: list[str]
    config: RunConfig
    repeat: int
    timeout_s: float | None = None
    """This variant's own time limit (a variant's timeout_s); None: the sweep's."""
    plan: Any = None
    """runplan.RunPlan of `config` (which is the plan's config: sources decided)."""

    @property
    def key(self) -> str:
        cfg = self.config.to_dict()
        cfg.pop("output_dir", None)
        cfg["launch"].pop("cpu_threads", None)  # the machine's cores decide it; result.json says
        blob = [self.program, cfg, self.repeat]
        # a lever the row pins is another run than one the plan decides, though the two come to
        # the same value on this machine (lora.fused: false and auto, on a CPU)
        pinned = sorted(c.key for c in getattr(self.plan, "levers", ()) if c.by == "set")
        if pinned:
            blob.append(pinned)
        blob = json.dumps(blob, sort_keys=True, default=str)
        return hashlib.sha1(blob.encode()).hexdigest()[:16]


@dataclass
class Sweep:
    name: str
    table: str
    runs: list[RunSpec]
    repeats: int
    timeout_s: float
    reference: str | None = None
    notes: str = ""
    spec: dict[str, Any] = field(default_factory=dict)


def _as_overrides(mapping: dict[str, Any] | None, where: str) -> list[str]:
    if mapping is None:
        return []
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where}: expected a mapping of key: value, got {mapping!r}")
    return [f"{k}={yaml_scalar(v)}" for k, v in mapping.items()]


def yaml_scalar(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _grid_points(grid: dict[str, Any] | None, where: str) -> list[dict[str, Any]]:
    if not grid:
        return [{}]
    if not isinstance(grid, dict):
        raise ConfigError(f"{where}: expected a mapping of key: [values], got {grid!r}")
    axes = {k: (v if isinstance(v, list) else [v]) for k, v in grid.items()}
    return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]


def parse_axis(text: str) -> tuple[str, list[Any]]:
    """'launch.nproc=1,2,4' -> ('launch.nproc', [1, 2, 4]); values read as YAML scalars."""
    import yaml

    key, sep, values = text.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise ConfigError(f"--grid: expected key=value1,value2,..., got {text!r}")
    try:
        return key.strip(), [yaml.safe_load(v.strip()) for v in values.split(",")]
    except yaml.YAMLError:
        raise ConfigError(f"--grid: cannot read the values of {text!r}") from None


def _check_variant(i: int, variant: Any) -> None:
    if not isinstance(variant, dict) or set(variant) - {
        "label",
        "program",
        "set",
        "grid",
        "timeout_s",
    }:
        raise ConfigError(
            f"sweep.variants[{i}]: expected keys label, program, set, grid, timeout_s; "
            f"got {variant!r}"
        )
    own_timeout = variant.get("timeout_s")
    if own_timeout is not None and (not isinstance(own_timeout, (int, float)) or own_timeout <= 0):
        raise ConfigError(
            f"sweep.variants[{i}].timeout_s: must be a number > 0, got {own_timeout!r}"
        )


def _only(variants: list, texts: list[str]) -> list:
    def label(v: Any) -> str:
        return str(v.get("label", v.get("program", "paratrain"))) if isinstance(v, dict) else ""

    def picked(name: str, text: str) -> bool:
        # "=label": that label exactly (one row whose label others contain); else a part of it
        if text.startswith("="):
            return name.lower() == text[1:].lower()
        return text.lower() in name.lower()

    kept = [v for v in variants if any(picked(label(v), t) for t in texts)]
    if not kept:
        raise ConfigError(
            f"--only: no variant's label matches {' or '.join(map(repr, texts))}; labels: "
            + ", ".join(repr(label(v)) for v in variants)
        )
    return kept


def _same_threads(runs: list[RunSpec]) -> None:
    """Every run of a sweep computes with the same threads per process: the cores over the
    largest process count (a run that sets launch.cpu_threads keeps its own)."""
    from paratrain.launch.torchrun import cores

    widest = max((r.plan.nproc for r in runs), default=1)
    for r in runs:
        if r.config.launch.cpu_threads is None:
            r.config.launch.cpu_threads = max(1, cores() // widest)


def _apply_cli(
    spec: dict[str, Any], sets: list[str] | None, axes: list[str] | None, repeats: int | None
) -> None:
    """The command line's --repeats, --grid and --set, into the sweep file's spec (before it is
    checked, so that they are checked alike)."""
    if repeats is not None:
        if repeats < 1:
            raise ConfigError(f"--repeats: must be >= 1, got {repeats}")
        spec["repeats"] = repeats
    for text in axes or []:
        key, values = parse_axis(text)
        spec["grid"] = {**(spec.get("grid") or {}), key: values}
        spec.setdefault("cli_grid", {})[key] = values
    if sets:
        spec["cli_set"] = list(sets)


def _check_keys(spec: dict[str, Any]) -> None:
    """A key the sweep does not know is refused: a typo would otherwise be silently ignored."""
    unknown = set(spec) - _KEYS - {"cli_set", "cli_grid"}
    if unknown:
        raise ConfigError(
            f"sweep: unknown key {sorted(unknown)[0]}; accepted: {', '.join(sorted(_KEYS))}"
        )


def _checked_settings(spec: dict[str, Any]) -> tuple[str, int, float]:
    """-> (table, repeats, timeout_s), checked before any run is resolved."""
    table = spec.get("table", "plain")
    if table not in TABLES:
        raise ConfigError(f"sweep.table: got {table!r}; accepted: {', '.join(TABLES)}")
    repeats = spec.get("repeats", 1)
    if not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"sweep.repeats: must be an integer >= 1, got {repeats!r}")
    timeout_s = spec.get("timeout_s", 1800)
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise ConfigError(f"sweep.timeout_s: must be a number > 0, got {timeout_s!r}")
    return table, repeats, timeout_s


def _variants(spec: dict[str, Any], only: list[str] | None) -> list[dict[str, Any]]:
    """The variants to run. All of them are checked, also those --only leaves out: a mistake in
    the file shows whichever part of it is asked for."""
    variants = spec.get("variants") or [{}]
    if not isinstance(variants, list):
        raise ConfigError("sweep.variants: expected a list of {label, program, set, grid}")
    for i, variant in enumerate(variants):
        _check_variant(i, variant)
    return _only(variants, only) if only else variants


def _variant_runs(
    i: int,
    variant: dict[str, Any],
    *,
    name: str,
    sweep_grid: Any,
    cli_grid: dict[str, list] | None = None,
    recipe_path: Path | None,
    common: list[str],
    repeats: int,
) -> list[RunSpec]:
    """One variant crossed with its grid (its own, else the sweep's), each point `repeats`
    times. An axis from the command line (`cli_grid`) that a variant's own grid does not name is
    crossed with that grid too: `--grid data.num_workers=4,8` reaches every row, while the
    single-GPU rows keep their own launch.nproc (a sweep that asked for the first once got one row of a
    single-GPU variant)."""
    program = variant.get("program", "paratrain")
    own_timeout = variant.get("timeout_s")
    if program not in PROGRAMS:
        raise ConfigError(
            f"sweep.variants[{i}].program: got {program!r}; accepted: {', '.join(PROGRAMS)}"
        )
    label = str(variant.get("label", program))
    extra = _as_overrides(variant.get("set"), f"sweep.variants[{i}].set")
    grid = variant.get("grid", sweep_grid)
    if "grid" in variant and isinstance(grid, dict) and cli_grid:
        grid = {**{k: v for k, v in cli_grid.items() if k not in grid}, **grid}
    where = f"sweep.variants[{i}].grid" if "grid" in variant else "sweep.grid"
    runs = []
    # a reference program runs what its config names and nothing paratrain would decide
    plain = [] if program == "paratrain" else ["levers=plain"]
    for point in _grid_points(grid, where):
        overrides = plain + common + extra + _as_overrides(point, "sweep.grid")
        plan = resolve(
            load_config(recipe_path, [f"name={name}", *overrides]),
            given=[parse_override(o)[0] for o in overrides],
        )
        params = {**(variant.get("set") or {}), **point}
        runs += [
            RunSpec(name, label, program, params, overrides, plan.config, r, own_timeout, plan)
            for r in range(repeats)
        ]
    return runs


def load_sweep(
    path: str | Path,
    sets: list[str] | None = None,
    axes: list[str] | None = None,
    repeats: int | None = None,
    only: list[str] | None = None,
) -> Sweep:
    """`sets` ('key=value') join the sweep's common `set:`; `axes` ('key=v1,v2') replace or add
    axes of its top-level grid (a variant's own grid, like the single-GPU speed of light, keeps
    the axes it names and is crossed with the others):
    the same sweep file then serves a machine with more GPUs. `repeats` replaces the sweep's;
    `only` keeps the variants whose label contains one of its texts. A run's key does not depend
    on either, so repeating one configuration later adds runs beside the stored ones."""
    path = Path(path)
    spec = read_yaml(path)
    _apply_cli(spec, sets, axes, repeats)
    _check_keys(spec)
    name = str(spec.get("name") or path.stem)
    recipe = spec.get("recipe")
    recipe_path = (path.parent / recipe) if recipe else None
    table, repeats, timeout_s = _checked_settings(spec)
    common = _as_overrides(spec.get("set"), "sweep.set") + list(sets or [])
    runs: list[RunSpec] = []
    for i, variant in enumerate(_variants(spec, only)):
        runs += _variant_runs(
            i,
            variant,
            name=name,
            sweep_grid=spec.get("grid"),
            cli_grid=spec.get("cli_grid"),
            recipe_path=recipe_path,
            common=common,
            repeats=repeats,
        )
    _same_threads(runs)
    return Sweep(
        name,
        table,
        runs,
        repeats,
        float(timeout_s),
        spec.get("reference"),
        spec.get("notes", ""),
        spec,
    )
