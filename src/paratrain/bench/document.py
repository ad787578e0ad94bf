"""A report of stored sweeps as one document: the tables (report.py) rendered as Markdown, CSV
or one self-contained HTML page (render.py), with the plots (plots.py) linked or embedded."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from paratrain.bench import render
from paratrain.bench.report import build_report, group_rows
from paratrain.bench.store import Store
from paratrain.errors import UserError


def stored(db: str, sweeps: list[str] | None) -> tuple[Store, dict]:
    """-> (the results file, {sweep: (kind, spec, rows)} of the sweeps asked for, or all)."""
    if not Path(db).is_file():
        raise UserError(f"--db: no results file at {db}; run `paratrain bench` first")
    store = Store(db)
    found = store.sweeps()
    names = sweeps or list(found)
    missing = [n for n in names if n not in found]
    if missing:
        raise UserError(
            f"--sweep: {missing[0]} is not in {db}; stored: {', '.join(found) or 'none'}"
        )
    return store, {n: (found[n][0], found[n][1], store.rows(n)) for n in names}


def make(
    data: dict, fmt: str, plot: str | None, db: str, out: str | None
) -> tuple[str, list[Path]]:
    """-> (the document's text, the plots made). plot: a folder for PNG plots ("" beside the
    results file, None for none). An HTML report embeds its plots (one file that opens
    offline): made for it in a temporary folder when plot names none."""
    tables, preamble = build_report(data)
    with tempfile.TemporaryDirectory(prefix="paratrain-plots-") as scratch:
        folder = str(Path(db).resolve().parent / "plots") if plot == "" else plot
        if folder is None and fmt == "html":
            folder = scratch
        by_sweep = plots(tables, data, folder) if folder is not None else {}
        made = [p for ps in by_sweep.values() for p in ps]
        if fmt == "csv":
            return render.to_csv(tables), made
        if fmt == "html":
            return render.to_html(tables, preamble, by_sweep), made
        return render.to_markdown(tables, preamble) + plot_links(made, out), made


def plots(tables, data: dict, folder: str) -> dict[str, list[Path]]:
    from paratrain.bench.plots import plots_for

    return {
        table.title: plots_for(kind, name, group_rows(rows), Path(folder))
        for table, (name, (kind, _, rows)) in zip(tables, data.items(), strict=False)
    }


def plot_links(made: list[Path], out: str | None) -> str:
    """Markdown links to the plots, relative to where the report is written."""
    if not made:
        return ""
    base = Path(out).resolve().parent if out else Path.cwd()
    links = [os.path.relpath(p.resolve(), base) for p in made]
    return (
        "\n## Plots\n\n"
        + "\n".join(f"![{p.stem}]({link})" for p, link in zip(made, links, strict=True))
        + "\n"
    )
