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
unpickler that builds only an exact list of DCP's metadata classes (safe_reader), its storage
entries may name only files of the folder its manifest lists (DCP would read a tensor from any
path they give), and every non-tensor value is read once, by torch.load(weights_only=True), and
stored by the planner itself; paratrain's own files (train_state.pt, rng_rank*.pt,
replica_rank*.pt) hold tensors and plain types and load with weights_only=True. A refusal names
the file and the global or opcode it asked for; a file that does not load at all (empty, cut
short, another format) is named as unreadable.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
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
    listed = _listed(folder)
    if listed is None:
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


def _listed(folder: Path) -> dict[str, dict] | None:
    """The manifest's files ({name: {"bytes", "sha256"}}), or None where it is not one a save
    wrote: each name a file of the folder itself, each entry its size and digest (a hand-edited
    or forged one is named, not a traceback)."""
    try:
        listed = json.loads((folder / MANIFEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(listed, dict):
        return None
    for name, want in listed.items():
        if not bare_name(name) or not isinstance(want, dict):
            return None
        size, digest = want.get("bytes"), want.get("sha256")
        if type(size) is not int or size < 0 or not isinstance(digest, str):
            return None
    return listed


def bare_name(name) -> bool:
    """A file name of the folder itself: no separator, not `.` or `..` (a path that reaches
    another folder, or the root, is none)."""
    if not isinstance(name, str) or name in ("", ".", ".."):
        return False
    return not any(sep and sep in name for sep in ("/", "\\", os.sep, os.altsep, "\0"))


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


class _Refused(pickle.UnpicklingError):
    """What _MetadataUnpickler will not build (a pickle that is merely damaged raises
    UnpicklingError too, and is said to be unreadable instead)."""


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes and plain values only. Every opcode that reaches a callable
    (GLOBAL, STACK_GLOBAL, INST, and EXT1/2/4 through copyreg's registry) asks find_class
    first; REDUCE, BUILD, OBJ and NEWOBJ then only ever see what it returned; a persistent id
    has no loader here and fails."""

    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED or (module == "torch" and name in _DTYPES):
            return super().find_class(module, name)
        raise _Refused(f"the global {name} of {module}")

    def persistent_load(self, pid):
        raise _Refused(f"a persistent id ({repr(pid)[:60]})")


def read_metadata(meta: Path):
    """DCP's .metadata, built by _MetadataUnpickler -> the Metadata object; UnsafeCheckpoint
    naming the file and the global it asked for, or saying it is unreadable."""
    from torch.distributed.checkpoint.metadata import Metadata

    where = f"{meta.parent.name}/{meta.name}"
    try:
        with open(meta, "rb") as f:
            found = _MetadataUnpickler(f).load()
    except _Refused as e:
        raise UnsafeCheckpoint(f"{where} asks for {e}, which loading would run; refused") from None
    except Exception as e:  # noqa: BLE001 - any other failure is a damaged file
        raise UnsafeCheckpoint(f"{where} is unreadable ({unreadable(e)})") from None
    if not isinstance(found, Metadata):
        raise UnsafeCheckpoint(f"{where} holds a {type(found).__name__}, not DCP's metadata")
    return found


def _outside(folder: Path, storage) -> str | None:
    """Where the metadata's storage entries send a read outside the checkpoint: DCP joins each
    entry's relative_path to the folder, so an absolute path or `..` would read a tensor from
    any file (unchecked by the manifest). Each must name a file of the folder its manifest
    lists."""
    if not isinstance(storage, dict):
        return f"{folder.name}/.metadata has no storage entries (not DCP's metadata)"
    listed = _listed(folder)
    for index, info in storage.items():
        name = getattr(info, "relative_path", None)
        fqn = getattr(index, "fqn", index)
        if not bare_name(name):
            return (
                f"{folder.name}/.metadata reads {fqn} from {str(name)[:120]!r}, outside the "
                "checkpoint's folder; refused"
            )
        if listed is not None and name not in listed:
            return (
                f"{folder.name}/.metadata reads {fqn} from {name}, a file its {MANIFEST} does "
                "not list; refused"
            )
    return None


def unsafe_metadata(folder: Path) -> str | None:
    """None when DCP's .metadata builds nothing but checkpoint metadata, and reads only the
    files its manifest lists."""
    meta = folder / ".metadata"
    if not meta.is_file():
        return f"{folder.name} has no .metadata (not a torch.distributed.checkpoint folder)"
    try:
        return _outside(folder, read_metadata(meta).storage_data)
    except UnsafeCheckpoint as e:
        return str(e)


def safe_reader(folder: Path):
    """DCP's FileSystemReader with its .metadata read by _MetadataUnpickler (DCP's own reader
    unpickles it with pickle.load), reading only files of the folder its manifest lists: every
    DCP load here goes through one."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            metadata = read_metadata(Path(self.path) / ".metadata")
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

        def read_data(self, plan, planner):
            # here, not in read_metadata: DCP retries a failed metadata read and logs both
            outside = _outside(Path(self.path), self.storage_data)
            if outside:
                raise UnsafeCheckpoint(outside)
            return super().read_data(plan, planner)

    return SafeReader(str(folder))


def asked_for(error: Exception) -> str | None:
    """What torch.load(weights_only=True) refused, in a few words: the global it was asked for
    or the pickle opcode it does not run (its message is a paragraph of advice); None for a
    file it could not read at all."""
    import pickletools

    if not isinstance(error, pickle.UnpicklingError):
        return None
    for line in str(error).splitlines():
        if "GLOBAL" in line:
            return line.strip().removeprefix("Trying to load ").rstrip(".")
        if line.startswith("Unsupported operand"):
            code = int(line.split()[-1]) if line.split()[-1].isdigit() else None
            names = {ord(op.code): op.name for op in pickletools.opcodes}
            return f"pickle opcode {names.get(code, code)}"
    return None


def refusal(error: Exception) -> str:
    """asked_for, else the error's first line."""
    text = str(error)
    found = asked_for(error)
    if found:
        return found
    return text.splitlines()[0][:200] if text.strip() else type(error).__name__


def unreadable(error: Exception) -> str:
    """Why a file did not load, in a few words: the exception's kind and its first line (an
    empty file's EOFError says nothing more)."""
    lines = str(error).strip().splitlines()
    first = lines[0].strip()[:160] if lines else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__


def plain_file(path: Path, where: str = ""):
    """One of paratrain's own files of a checkpoint (tensors and plain types) by
    torch.load(weights_only=True) -> its value; UnsafeCheckpoint naming it and what it asked
    for, or saying it is unreadable (empty, cut short, another format: a legacy tar,
    TorchScript)."""
    try:
        with warnings.catch_warnings():  # a forged file's protocol: refused below, not warned of
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - a file that does not load is named, whatever failed
        what = asked_for(e)
        if what:
            raise UnsafeCheckpoint(
                f"{where}{path} asks for {what}, which loading would run; refused"
            ) from None
        raise UnsafeCheckpoint(f"{where}{path} is unreadable ({unreadable(e)})") from None


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


def checked_value(value: io.BytesIO, name: str):
    """A DCP non-tensor value (`name`) -> the object, read by torch.load(weights_only=True)
    (with only _trusted_classes added); UnsafeCheckpoint where it asks for more or does not
    load."""
    try:
        with trusted(), warnings.catch_warnings():  # a forged value's protocol: refused below
            warnings.simplefilter("ignore", UserWarning)
            return torch.load(value, weights_only=True)
    except Exception as e:  # noqa: BLE001 - a value that does not load is named, whatever failed
        what = asked_for(e)
        if what:
            raise UnsafeCheckpoint(
                f"its value {name} asks for {what}, which loading would run; refused"
            ) from None
        raise UnsafeCheckpoint(f"its value {name} is unreadable ({unreadable(e)})") from None


def checked_bytes(value: io.BytesIO, name: str) -> io.BytesIO:
    """checked_value, and the bytes back for DCP's own load (where the planner cannot store
    the checked object itself)."""
    checked_value(value, name)
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
    """DCP load planners whose non-tensor values are read once, by checked_value: (into a state
    dict, into an empty one as format_utils' converter uses). DCP's own load_bytes reads them
    with torch.load(weights_only=False); here the checked object is stored as it would store
    its own, or (a torch whose planner keeps them elsewhere) checked first and handed on."""
    from torch.distributed.checkpoint.default_planner import (
        DefaultLoadPlanner,
        _EmptyStateDictLoadPlanner,
    )

    try:  # private: where DCP's own load_bytes puts a value into a nested state dict
        from torch.distributed.checkpoint._traverse import set_element
    except ImportError:
        set_element = None

    def load_bytes(planner, read_item, value, plain) -> None:
        fqn = read_item.dest_index.fqn
        own = ("flatten_state_dict", "original_state_dict", "mappings", "state_dict")
        if set_element is None or not all(hasattr(planner, a) for a in own):
            plain(read_item, checked_bytes(value, fqn))
            return
        found = checked_value(value, fqn)
        if planner.flatten_state_dict:
            set_element(planner.original_state_dict, planner.mappings[fqn], found)
        else:
            planner.state_dict[fqn] = found

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            load_bytes(self, read_item, value, super().load_bytes)

    class SafeEmptyPlanner(_EmptyStateDictLoadPlanner):
        def load_bytes(self, read_item, value):
            load_bytes(self, read_item, value, super().load_bytes)

    return SafeLoadPlanner, SafeEmptyPlanner


def checkpoint_index(folder: Path) -> dict:
    """{tensor or value name: DCP's storage metadata of it (TensorStorageMetadata or
    BytesStorageMetadata)} (after unsafe_metadata passed)."""
    return dict(safe_reader(folder).read_metadata().state_dict_metadata)


def checkpoint_keys(folder: Path) -> set[str]:
    """The tensor and value names a checkpoint holds (after unsafe_metadata passed)."""
    return set(safe_reader(folder).read_metadata().state_dict_metadata)
