"""`paratrain tune`'s output: the ranked table, tune.json, and the winning set-up as a recipe whose
changed levers each carry a comment (what it is, what it measured against the recipe's value)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from paratrain.config import parse_override, read_yaml, set_dotted
from paratrain.tune.search import Search, Trial
from paratrain.tune.space import COMPOUND

ORDER = {"ok": 0, "numerics": 1, "failed": 2, "timeout": 2, "invalid": 3, "pruned": 4, "budget": 5}


def ranked(trials: list[Trial]) -> list[Trial]:
    return sorted(trials, key=lambda t: (ORDER.get(t.status, 9), -(t.throughput or 0.0)))


def _scalar(v: Any) -> str:
    return (
        yaml.safe_dump(v, default_flow_style=True, width=10_000).strip().removesuffix("...").strip()
    )


def dump_commented(raw: dict[str, Any], comments: dict[str, str]) -> str:
    """A recipe as YAML, `comments` ({dotted key: text}) after their lines."""
    lines: list[str] = []

    def walk(d: dict[str, Any], prefix: str, indent: int) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            pad = "  " * indent
            if isinstance(v, dict) and v:
                lines.append(f"{pad}{k}:" + (f"  # {comments[key]}" if key in comments else ""))
                walk(v, key + ".", indent + 1)
            else:
                note = f"  # {comments[key]}" if key in comments else ""
                lines.append(f"{pad}{k}: {_scalar(v)}{note}")

    walk(raw, "", 0)
    return "\n".join(lines) + "\n"


def tuned_recipe(search: Search, best: Trial, baseline: Trial, unit: str) -> str:
    raw = read_yaml(search.recipe)
    raw.pop("name", None)
    comments: dict[str, str] = {}
    by_key = {lv.key: lv for lv in search.space.levers}
    for key, value in best.changed.items():
        lever = by_key.get(key)
        overrides = lever.overrides(value) if lever else [f"{key}={value}"]
        was = lever.values[0] if lever else None
        for item in overrides:
            k, v = parse_override(item)
            set_dotted(raw, k, v)
            why = f"{lever.why}; " if lever and lever.why else ""
            shown = f"{key}={value}" if key in COMPOUND else _scalar(value)
            comments[k] = f"tune: {why}{shown} (recipe: {_scalar(was)})"
    header = [
        f"# Found by `paratrain tune {search.recipe}`: {best.throughput:,.1f} {unit} against the "
        f"recipe's {baseline.throughput:,.1f} ({best.throughput / baseline.throughput:.2f}x), "
        f"trial {best.index} of {len(search.trials)}.",
        f"# Trials of {search.args.steps} steps after warm-up; the numerics guard's band "
        f"{search.args.loss_band:.0%} against "
        + (
            "the recipe's own loss."
            if search.reference is baseline
            else f"the reference ({search.reference.label})."
        ),
    ]
    return "\n".join(header) + "\n" + dump_commented(raw, comments)


def write(search: Search, found: dict[str, Any]) -> dict[str, Path]:
    out = search.args.out
    out.mkdir(parents=True, exist_ok=True)
    best, baseline = found["best"], found["baseline"]
    unit = "tokens/s" if search.lm else "samples/s"
    recipe = out / "tuned.yaml"
    recipe.write_text(tuned_recipe(search, best, baseline, unit))
    trials = [
        {**{k: v for k, v in asdict(t).items() if k != "row"}, "label": t.label}
        for t in ranked(search.trials)
    ]
    summary = {
        "recipe": search.recipe,
        "unit": unit,
        "budget_s": search.args.budget_s,
        "elapsed_s": search.args.budget_s - search.left_s(),
        "best": best.index,
        "baseline": baseline.index,
        "reference": search.reference.index if search.reference else None,
        "speedup": best.throughput / baseline.throughput,
        "levers": [asdict(lv) for lv in search.space.levers],
        "trials": trials,
    }
    path = out / "tune.json"
    path.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return {"recipe": recipe, "json": path}


def print_table(search: Search, found: dict[str, Any]) -> None:
    from rich.table import Table

    from paratrain.meters.metrics import console as wide_console

    console = wide_console()  # a pipe or a log: the table's rows whole, not wrapped at 80
    best, baseline = found["best"], found["baseline"]
    unit = "tokens/s" if search.lm else "samples/s"
    energy = "mJ/token" if search.lm else "J/sample"
    table = Table(title=f"paratrain tune {search.cfg.name}: {len(search.trials)} trials")
    for col in (
        "#",
        "set-up (levers changed from the recipe)",
        unit,
        "vs recipe",
        "memory",
        energy,
        "loss vs ref",
        "status",
    ):
        table.add_column(col, justify="left" if col.startswith(("set-up", "status")) else "right")
    for t in ranked(search.trials):
        mark = " (best)" if t is best else ""
        e = t.energy_per_unit
        table.add_row(
            str(t.index),
            t.label + mark,
            f"{t.throughput:,.1f}" if t.throughput else "",
            f"{t.throughput / baseline.throughput:.2f}x" if t.throughput else "",
            f"{t.memory_bytes / 2**20:,.0f} MiB" if t.memory_bytes else "",
            (f"{e * 1000:.3f}" if search.lm else f"{e:.3f}") if e else "",
            f"{t.loss_vs_reference:+.1%}" if t.loss_vs_reference is not None else "",
            t.status + (" (stored)" if t.reused else "") + (f": {t.note}" if t.note else ""),
        )
    console.print(table)
