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
    except Exception as e:  # a bug or a broken install: the traceback, and what mends the install
        add_install_notes(e)
        raise


def add_install_notes(e: BaseException) -> None:
    """A failure in this process that the install explains (a run on one process; job.py
    reports a worker's): the install's problems, one line each, after the traceback."""
    import traceback

    from paratrain import install

    for line in install.explain(type(e).__name__, "".join(traceback.format_exception(e))):
        if hasattr(e, "add_note"):  # Python 3.11+
            e.add_note(line)
        else:
            print(line, file=sys.stderr)


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
