"""`paratrain report`: tables and plots from stored results, beside the seed's."""

from __future__ import annotations

import argparse


def add(sub) -> None:
    report = sub.add_parser(
        "report", help="tables (and plots) from stored results, beside the seed's"
    )
    report.add_argument("--db", default="paratrain-results.db", help="SQLite results file")
    report.add_argument("--sweep", action="append", help="only these sweeps (repeatable)")
    report.add_argument("--format", choices=("md", "csv", "html"), default="md")
    report.add_argument("--out", help="write the report here instead of printing it")
    report.add_argument(
        "--plot",
        nargs="?",
        const="",
        metavar="DIR",
        help="write PNG plots to DIR (default: plots/ beside the results file); an HTML report "
        "embeds them either way",
    )
    report.add_argument("--export-csv", metavar="FILE", help="also export every stored run as CSV")
    report.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from paratrain.bench import document

    store, data = document.stored(args.db, args.sweep)
    text, made = document.make(data, args.format, args.plot, args.db, args.out)
    if args.plot is not None:
        shown = ", ".join(map(str, made)) or "none (nothing to plot)"
        print(f"paratrain report: plots: {shown}", flush=True)
    if args.export_csv:
        store.export_csv(args.export_csv)
    if args.out:
        Path(args.out).write_text(text)
        print(f"paratrain report: written to {args.out}")
    else:
        print(text)
    return 0
