"""The paratrain command: one module per subcommand (run, demo, bench, report, export, flight,
doctor, plan, tune, comm), each with `add(sub)` (its arguments) and `command(args)` (parse,
then call one function of the part that does the work).

User mistakes (paratrain.errors.UserError) print one line and exit with 2; nothing is written
before a config has been validated.
"""

from __future__ import annotations

import argparse
import os
import sys

from paratrain.cli import bench, comm, demo, doctor, export, flight, plan, report, run, tune
from paratrain.errors import Interrupted, UserError, one_line

COMMANDS = (run, demo, bench, report, export, flight, doctor, plan, tune, comm)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except UserError as e:
        print(f"paratrain: error: {one_line(e)}", file=sys.stderr)
        return 2
    except Interrupted as e:  # Ctrl-C / SIGTERM, stopped at a step boundary
        print(e.line(), file=sys.stderr, flush=True)
        return 130
    except KeyboardInterrupt:
        print("paratrain: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="paratrain",
        description="Train PyTorch models on one GPU, many GPUs and many nodes; measure which "
        "way is fastest.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add(sub)
    return parser


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
