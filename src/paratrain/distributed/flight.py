"""PyTorch's flight recorder, switched on and read back.

Every rank keeps its last `dist.flight_recorder` collectives (NCCL's and gloo's: the operation,
its group and sequence number, its state, sizes, the Python stack that issued it). They are
dumped to <output_dir>/flight_recorder/rank_<r>: by every rank's watchdog thread when the
watchdog finds a rank behind (trainer/watchdog.py), by a rank whose collective failed for a
lost peer (killed, or stopped past the timeout: dump_after_failure), and, under NCCL, by
PyTorch itself when a collective times out. `paratrain flight DIR` reads the dumps and names, per process group, the
first collective that not every rank entered, which ranks did and did not, and where in the
code each rank stands. (PyTorch's own analyzer, `torchfrtrace DIR`, reads the same files.)"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

from paratrain.errors import UserError, lost_peer

PREFIX = "rank_"


def enable(entries: int, folder: Path | None, cuda: bool) -> None:
    """Before the process group is made (PyTorch reads these when it creates a backend); the
    user's own settings win."""
    if entries <= 0:
        return
    # (torch 2.11 and later read the FR names for NCCL too; the NCCL_ ones are deprecated)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", str(entries))
    if cuda:
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    if folder is not None:  # made by setup once the run's checks have passed
        os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", str(folder / PREFIX))


def dump(folder: Path, rank: int, backend: str | None) -> Path | None:
    """This rank's recorder to folder/rank_<rank> (from any thread: the main one may be
    blocked in the collective that hangs). None when there is nothing to dump."""
    import torch._C._distributed_c10d as c10d

    take = c10d._dump_nccl_trace if backend == "nccl" else c10d._dump_fr_trace
    try:
        data = take()
    except Exception:  # noqa: BLE001 - no recorder in this build or backend
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{PREFIX}{rank}"
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


def dump_after_failure(e: BaseException, folder: Path | None, rank: int, backend: str | None):
    """This rank's recorder, when a collective failed because of another rank (its peer was
    killed, or stopped past dist.timeout_s): the dumps of those still alive name the
    collective the lost rank did not enter (job.py's report). None when it was no such
    failure."""
    import torch.distributed as dist

    if folder is None or backend is None or not dist.is_initialized():
        return None
    if not lost_peer(e):
        return None
    try:
        if not (folder / "job.json").is_file():  # (a watchdog's note, when it spoke, stays)
            folder.mkdir(parents=True, exist_ok=True)
            note = {"world_size": dist.get_world_size(), "failed": {"rank": rank}}
            (folder / "job.json").write_text(json.dumps(note))
        return dump(folder, rank, backend)
    except OSError:  # a full disk: the report goes on without it
        return None


def note_job(folder: Path, world: int, incident: dict) -> None:
    """What the dumps alone do not say: how many ranks the job has (gloo's recorder lists only
    the rank itself in a group), and what the watchdog saw."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.json").write_text(json.dumps({"world_size": world, "incident": incident}))


def read_job(folder: Path) -> dict:
    try:
        return json.loads((folder / "job.json").read_text())
    except (OSError, ValueError):
        return {}


class _PlainUnpickler(pickle.Unpickler):
    """A dump holds dicts, lists, strings and numbers; nothing else is built (reading a dump
    from elsewhere runs no code)."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def dump_folder(folder: str | Path) -> Path:
    folder = Path(folder)
    return folder / "flight_recorder" if (folder / "flight_recorder").is_dir() else folder


def read_dumps(folder: str | Path) -> dict[int, dict]:
    folder = dump_folder(folder)
    if not folder.is_dir():
        raise UserError(f"flight: {folder} is not a folder of flight recorder dumps")
    dumps = {}
    for path in sorted(folder.iterdir()):
        m = re.search(r"(\d+)$", path.name)
        if not m or path.name.startswith("."):
            continue
        try:
            with open(path, "rb") as f:
                dumps[int(m.group(1))] = _PlainUnpickler(f).load()
        except (pickle.UnpicklingError, EOFError, ValueError) as e:
            raise UserError(f"flight: {path} is not a flight recorder dump ({e})") from None
    if not dumps:
        raise UserError(f"flight: no dumps (rank_<r>) in {folder}")
    return dumps


def _where(entry: dict) -> str:
    """The innermost frame outside torch: the line of the program that issued it."""
    for frame in entry.get("frames") or []:
        if f"{os.sep}torch{os.sep}" not in frame.get("filename", ""):
            return f"{Path(frame['filename']).name}:{frame['line']} {frame['name']}"
    return "?"


def _describe(entry: dict) -> str:
    sizes = entry.get("input_sizes") or []
    return f"{entry['profiling_name']} #{entry['collective_seq_id']} {sizes}"


def _group_ranks(dumps: dict[int, dict]) -> dict[str, list[int]]:
    """Each process group's members, as every dump's pg_config names them (a rank's own dump
    may list only some)."""
    groups: dict[str, list[int]] = {}
    for d in dumps.values():
        for name, pg in (d.get("pg_config") or {}).items():
            ranks = {int(r) for r in re.findall(r"\d+", pg.get("ranks", ""))}
            groups[name] = sorted(ranks | set(groups.get(name, [])))
    return groups


def _collectives(dumps: dict[int, dict]) -> dict[str, dict[int, list[dict]]]:
    """group id -> rank -> the collectives it entered (point-to-point ones left out: they have
    no sequence shared by the whole group)."""
    by_group: dict[str, dict[int, list[dict]]] = {}
    for rank, d in dumps.items():
        for e in d.get("entries", []):
            if e.get("is_p2p"):
                continue
            by_group.setdefault(e["process_group"][0], {}).setdefault(rank, []).append(e)
    return by_group


def _last_seq(members: list[int], per_rank: dict[int, list[dict]], dumps: dict) -> dict[int, int]:
    """Each dumped member's newest collective sequence number in the group (-1: none)."""
    return {
        r: max(e["collective_seq_id"] for e in per_rank.get(r, [{}]) if "collective_seq_id" in e)
        if per_rank.get(r)
        else -1
        for r in members
        if r in dumps
    }


def _behind_lines(
    head: str, per_rank: dict[int, list[dict]], last: dict[int, int], top: int, behind: list[int]
) -> list[str]:
    """The collective the furthest ranks entered and the others did not, then where each of
    those others last was: what to look at first in a hang."""
    waiting = sorted(r for r in last if last[r] == top)
    entry = next(e for e in per_rank[waiting[0]] if e["collective_seq_id"] == top)
    lines = [
        f"{head}: {_describe(entry)} was entered by rank{'s' if len(waiting) > 1 else ''} "
        f"{', '.join(map(str, waiting))} ({_where(entry)}) but not by "
        f"{', '.join(map(str, behind))}"
    ]
    for r in behind:
        if r in per_rank:
            own = max(per_rank[r], key=lambda e: e["collective_seq_id"])
            lines.append(f"  rank {r} last entered {_describe(own)} ({_where(own)})")
    return lines


def _level(gid: str, per_rank: dict[int, list[dict]], world: list[int], groups: dict, dumps):
    """One process group: its name, members, each dumped member's newest sequence number, the
    newest of all, and the members behind it."""
    name = next(iter(per_rank.values()))[0]["process_group"][1]
    members = world if name == "default_pg" else groups.get(gid) or sorted(per_rank)
    last = _last_seq(members, per_rank, dumps)
    top = max(last.values(), default=-1)
    behind = sorted(r for r in members if r not in dumps or last.get(r, -1) < top)
    return name, members, last, top, behind


def _group_lines(
    gid: str, per_rank: dict[int, list[dict]], world: list[int], groups: dict, dumps: dict
) -> list[str]:
    """One process group: every member level, or who is behind on which collective."""
    name, members, last, top, behind = _level(gid, per_rank, world, groups, dumps)
    head = f"group {gid} ({name}, ranks {members})"
    if behind:
        return _behind_lines(head, per_rank, last, top, behind)
    ahead = [e for e in per_rank[next(iter(last))] if e["collective_seq_id"] == top]
    state = ahead[-1]["state"] if ahead else "?"
    return [f"{head}: every rank entered {_describe(ahead[-1])} ({state})"]


def _world(dumps: dict[int, dict], groups: dict, world_size: int | None) -> list[int]:
    """The job's ranks: world_size's, else those the dumps name."""
    if world_size:
        return list(range(world_size))
    return sorted({r for ranks in groups.values() for r in ranks} | set(dumps))


def waited_in(folder: str | Path, rank: int) -> str | None:
    """The collective the other ranks wait in for `rank`, from the dumps in folder:
    "gloo:all_reduce #46 [[1]] (interrupts.py:80 stop_at)" (one that rank did not enter); None when
    there are no readable dumps or rank is behind in none of their groups."""
    try:
        dumps = read_dumps(folder)
    except (UserError, OSError):
        return None
    groups = _group_ranks(dumps)
    world = _world(dumps, groups, read_job(dump_folder(folder)).get("world_size"))
    for gid, per_rank in sorted(_collectives(dumps).items()):
        _, _, last, top, behind = _level(gid, per_rank, world, groups, dumps)
        waiting = sorted(r for r in last if last[r] == top)
        if rank in behind and waiting:
            entry = next(e for e in per_rank[waiting[0]] if e["collective_seq_id"] == top)
            return f"{_describe(entry)} ({_where(entry)})"
    return None


def analyze(dumps: dict[int, dict], world_size: int | None = None) -> list[str]:
    """-> lines naming, per process group, the first collective not every member entered.
    world_size: the job's ranks (else those the dumps name)."""
    groups = _group_ranks(dumps)
    world = _world(dumps, groups, world_size)
    lines = [
        f"rank {r}: no dump (stopped, killed, or stuck outside Python)"
        for r in world
        if r not in dumps
    ]
    for gid, per_rank in sorted(_collectives(dumps).items()):
        lines += _group_lines(gid, per_rank, world, groups, dumps)
    return lines
