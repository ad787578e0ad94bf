"""The paratrain command: one module per subcommand (run, demo, bench, report, export, flight,
doctor, plan, tune, comm), each with `add(sub)` (its arguments) and `command(args)` (parse,
then call one function of the part that does the work).

User mistakes (paratrain.errors.UserError) print one line and exit with 2; nothing is written
before a config has been validated.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

from paratrain import trust
from paratrain.cli import bench, comm, demo, doctor, export, flight, plan, report, run, tune
from paratrain.errors import Interrupted, UserError, one_line
from paratrain.launch.torchrun import quiet_native_log

COMMANDS = (run, demo, bench, report, export, flight, doctor, plan, tune, comm)


def main(argv: list[str] | None = None) -> int:
    # before the parser's imports load torch (it reads the level once, then)
    words = sys.argv[1:] if argv is None else argv
    verbose = any(str(w).startswith("--verb") for w in words)  # (argparse takes "--verb")
    quiet_native_log(verbose=verbose or os.environ.get("PARATRAIN_VERBOSE") == "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    # the folder a command read its config from is that command's (a caller in one process:
    # a notebook, the tests, runs several)
    config_folder = os.environ.get(trust.CONFIG_FOLDER_ENV)
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
    finally:
        trust.config_from(config_folder)


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


class Parser(argparse.ArgumentParser):
    """argparse with the house's errors: one line, exit 2, no usage block (--help has it)."""

    def error(self, message: str):
        print(f"paratrain: error: {flag_error(self, message)}", file=sys.stderr)
        raise SystemExit(2)


_BAD_NUMBER = re.compile(r"argument (\S+?)(?:/\S+)?: invalid (int|float) value: '(.*)'")


def flag_error(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's message, a bad number said with the flag and an example of a good one."""
    bad = _BAD_NUMBER.fullmatch(message)
    if not bad:
        return f"{message} (see {parser.prog} --help)"
    flag, kind, value = bad.groups()
    action = next((a for a in parser._actions if flag in a.option_strings), None)
    example = getattr(action, "default", None)
    if example is None or example is argparse.SUPPRESS:
        example = 2 if kind == "int" else 0.5
    what = "a whole number" if kind == "int" and _is_float(value) else "a number"
    return f"{flag}: '{value}' is not {what} (e.g. {flag} {example})"


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
