"""`paratrain flight`: read flight recorder dumps."""

from __future__ import annotations

import argparse


def add(sub) -> None:
    flight = sub.add_parser(
        "flight",
        help="read flight recorder dumps: the collective a hung job's ranks did not all reach",
    )
    flight.add_argument("folder", help="a run folder, or its flight_recorder/ folder")
    flight.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from paratrain.distributed.flight import analyze, dump_folder, read_dumps, read_job

    dumps = read_dumps(args.folder)
    job = read_job(dump_folder(args.folder))
    print(f"paratrain: flight recorder dumps of ranks {', '.join(map(str, sorted(dumps)))}")
    if job.get("incident"):
        print(f"watchdog: {job['incident']}")
    for line in analyze(dumps, job.get("world_size")):
        print(line)
    return 0
