"""Checkpoints that can be trusted: a manifest of checksums written last, and loading that runs
no code from the files.

manifest.json lists every file of a checkpoint folder with its size and SHA-256. Each rank
hashes the files it wrote, rank 0 writes the manifest once all of them have, and only then is
the folder renamed into place: a folder without a manifest was never finished, and one whose
files do not match it was damaged after it was written (a truncated copy, a bad disk). Either
is named, and `checkpoint.resume=auto` falls back to the previous good one.

DCP's own loading unpickles its `.metadata` file and reads non-tensor values (optimizer
hyper-parameters) with torch.load(weights_only=False): a checkpoint from someone else could run
anything on every rank. Here `.metadata` is read, by every check and every load, by an
unpickler that builds only an exact list of DCP's metadata classes (safe_reader), and every
non-tensor value passes torch.load(weights_only=True) before DCP sees it; paratrain's own files
(train_state.pt, rng_rank*.pt, replica_rank*.pt) hold tensors and plain types and load with
weights_only=True. A refusal names the file and the global or opcode it asked for.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import pickle
import warnings
from pathlib import Path

import torch

MANIFEST = "manifest.json"
_FORMAT = 1


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def own_files(folder: Path, rank: int) -> list[Path]:
    """The files of a checkpoint folder that `rank` wrote: its DCP shards and random state;
    rank 0 also DCP's .metadata and train_state.pt."""
    mine = sorted(folder.glob(f"__{rank}_*.distcp")) + sorted(folder.glob(f"rng_rank{rank:05d}.pt"))
    mine += sorted(folder.glob(f"replica_rank{rank:05d}.pt"))  # sync.mode's own replicas
    if rank == 0:
        mine += [p for p in (folder / ".metadata", folder / "train_state.pt") if p.is_file()]
    return mine


def digests(files: list[Path]) -> dict[str, dict]:
    return {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}


def write_manifest(
    folder: Path, step: int, files: dict[str, dict], owner: dict | None = None
) -> None:
    """Rank 0, after every rank's digests are in: the last file of the folder. owner: the run
    and the line of checkpoints it belongs to (`owner`)."""
    body = {"format": _FORMAT, "step": step, "files": dict(sorted(files.items()))}
    body["owner"] = owner or {}
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(body, indent=1))
    tmp.replace(folder / MANIFEST)


def owner(folder: Path) -> dict:
    """Whose a checkpoint is: {"run": the run folder's id, "lineage": the line of checkpoints
    it continues, "parent": [lineage, step] where that line branched off}; {} for one written
    before checkpoints carried it, or one without a readable manifest."""
    try:
        found = json.loads((folder / MANIFEST).read_text()).get("owner")
    except (OSError, ValueError, AttributeError):
        return {}
    return found if isinstance(found, dict) else {}


def problem(folder: Path, share: tuple[int, int] = (0, 1)) -> str | None:
    """What is wrong with a checkpoint folder, or None. share=(i, n): check only every n-th
    listed file from the i-th (ranks split the hashing of a large checkpoint)."""
    manifest = folder / MANIFEST
    if not manifest.is_file():
        return f"{folder.name} has no {MANIFEST} (never finished, or written before checksums)"
    try:
        listed = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        return f"{folder.name}/{MANIFEST} is not a paratrain manifest"
    i, n = share
    for k, (name, want) in enumerate(sorted(listed.items())):
        path = folder / name
        if k % n != i:
            continue
        if not path.is_file():
            return f"{folder.name}/{name} is missing"
        if path.stat().st_size != want["bytes"]:
            return (
                f"{folder.name}/{name} has {path.stat().st_size} bytes, the manifest says "
                f"{want['bytes']}"
            )
        if _sha256(path) != want["sha256"]:
            return f"{folder.name}/{name} does not match its checksum"
    return unsafe_metadata(folder) if i == 0 else None


# ---------------------------------------------------------------------------- no code on load

# What DCP's .metadata pickles (torch 2.11 - 2.14): its dataclasses, sizes, dtypes, layouts,
# paths. Exact (module, name) pairs: a prefix would let `module.os.system`-style dotted names
# (protocol 4 resolves them attribute by attribute) reach anything the module imported.
_METADATA = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    *(
        (_METADATA, name)
        for name in (
            "Metadata",
            "StorageMeta",
            "MetadataIndex",
            "ChunkStorageMetadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "TensorProperties",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}
_DTYPES = {name for name in dir(torch) if isinstance(getattr(torch, name), torch.dtype)}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes and plain values only. Every opcode that reaches a callable
    (GLOBAL, STACK_GLOBAL, INST, and EXT1/2/4 through copyreg's registry) asks find_class
    first; REDUCE, BUILD, OBJ and NEWOBJ then only ever see what it returned; a persistent id
    has no loader here and fails."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"the global {name} of {module}")

    def persistent_load(self, pid):
        raise pickle.UnpicklingError(f"a persistent id ({repr(pid)[:60]})")


def read_metadata(meta: Path):
    """DCP's .metadata, built by _MetadataUnpickler -> the Metadata object; UnsafeCheckpoint
    naming the file and the global it asked for."""
    try:
        with open(meta, "rb") as f:
            return _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpoint(
            f"{meta.parent.name}/{meta.name} asks for {e}, which loading would run; refused"
        ) from None
    except Exception as e:  # noqa: BLE001 - any unreadable pickle is a damaged file
        raise UnsafeCheckpoint(
            f"{meta.parent.name}/{meta.name} is unreadable ({type(e).__name__})"
        ) from None


def unsafe_metadata(folder: Path) -> str | None:
    """None when DCP's .metadata builds nothing but checkpoint metadata."""
    meta = folder / ".metadata"
    if not meta.is_file():
        return f"{folder.name} has no .metadata (not a torch.distributed.checkpoint folder)"
    try:
        read_metadata(meta)
    except UnsafeCheckpoint as e:
        return str(e)
    return None


def safe_reader(folder: Path):
    """DCP's FileSystemReader with its .metadata read by _MetadataUnpickler (DCP's own reader
    unpickles it with pickle.load): every DCP load here goes through one."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_metadata(Path(self.path) / ".metadata")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeReader(str(folder))


def refusal(error: Exception) -> str:
    """torch.load(weights_only=True)'s refusal in a few words: the global it was asked for or
    the pickle opcode it does not run (its message is a paragraph of advice)."""
    import pickletools

    text = str(error)
    for line in text.splitlines():
        if "GLOBAL" in line:
            return line.strip().removeprefix("Trying to load ").rstrip(".")
        if line.startswith("Unsupported operand"):
            code = int(line.split()[-1]) if line.split()[-1].isdigit() else None
            names = {ord(op.code): op.name for op in pickletools.opcodes}
            return f"pickle opcode {names.get(code, code)}"
    return text.splitlines()[0][:200] if text else type(error).__name__


def _trusted_classes() -> list:
    """Tensor subclasses a checkpoint may hold as values: torchao's low-bit optimizer states
    (train.optimizer=adamw8bit / adamw4bit / adamw-fp8), rebuilt from their tensors and
    sizes alone."""
    try:
        from torchao.optim.subclass_4bit import OptimState4bit
        from torchao.optim.subclass_8bit import OptimState8bit
        from torchao.optim.subclass_fp8 import OptimStateFp8
    except ImportError:
        return []
    return [OptimState4bit, OptimState8bit, OptimStateFp8]


def trusted():
    """torch.load(weights_only=True) with _trusted_classes allowed (DCP's reader on newer torch
    loads byte values that way itself). Registered for the process (torch's add_safe_globals):
    a context manager's allowlist did not reach DCP's reads in every case."""
    torch.serialization.add_safe_globals(_trusted_classes())
    return contextlib.nullcontext()


def checked_bytes(value: io.BytesIO, name: str) -> io.BytesIO:
    """A DCP non-tensor value (`name`), refused unless torch.load(weights_only=True) reads it
    (with only _trusted_classes added)."""
    try:
        with trusted(), warnings.catch_warnings():  # a forged value's protocol: refused below
            warnings.simplefilter("ignore", UserWarning)
            torch.load(value, weights_only=True)
    except pickle.UnpicklingError as e:
        raise UnsafeCheckpoint(
            f"its value {name} asks for {refusal(e)}, which loading would run; refused"
        ) from None
    value.seek(0)
    return value


class UnsafeCheckpoint(Exception):
    pass


@contextlib.contextmanager
def unwrapped():
    """DCP's reads inside: DCP wraps what a rank raised in a CheckpointException (a
    BaseException, past `except Exception`); out of here comes the rank's own exception, a
    refusal as the UnsafeCheckpoint it was."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as e:
        raised = [exc for exc, _ in e.failures.values()]
        refused = next((x for x in raised if isinstance(x, UnsafeCheckpoint)), None)
        first = refused or next((x for x in raised if isinstance(x, Exception)), None)
        if first is None:
            raise
        raise first from None


def safe_planners():
    """DCP load planners whose non-tensor values pass checked_bytes first: (into a state dict,
    into an empty one as format_utils' converter uses)."""
    from torch.distributed.checkpoint.default_planner import (
        DefaultLoadPlanner,
        _EmptyStateDictLoadPlanner,
    )

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            super().load_bytes(read_item, checked_bytes(value, read_item.dest_index.fqn))

    class SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item, value):
            super().load_bytes(read_item, checked_bytes(value, read_item.dest_index.fqn))

    return SafeLoadPlanner, SafeEmptyPlanner


def checkpoint_keys(folder: Path) -> set[str]:
    """The tensor and value names a checkpoint holds (after unsafe_metadata passed)."""
    return set(safe_reader(folder).read_metadata().state_dict_metadata)
