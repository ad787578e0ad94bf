"""A checkpoint someone hands you runs no code: pickles forged through every opcode that can
reach a callable, put into every kind of file a checkpoint holds, with a manifest rewritten to
match as a forger would. Each is refused in one line naming the file and what it asked for,
and the marker the forgery would create never appears: by the integrity check, the trainer's
load, the one-process reader (export, the Python API), and the commands themselves."""

import copyreg
import io
import json
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from conftest import TINY_LM, one_error_line, train

from paratrain.checkpoint import (
    integrity,
    list_checkpoints,
    load_checkpoint,
    read_checkpoint,
    read_replica,
    save_checkpoint,
)
from paratrain.checkpoint.store import LoopState
from paratrain.cli import main
from paratrain.config import load_config
from paratrain.errors import UserError

# ------------------------------------------------------------------ pickles, opcode by opcode

# copyreg extension codes, one callable each (a process may have some registered)
EXT = {
    "EXT1": (0xF1, ("os", "mkdir")),
    "EXT2": (0x1F2F, ("posix", "mkdir")),
    "EXT4": (0x1F2F3F4F, ("os", "makedirs")),
}
HIT = "paratrain_forgery_hit"  # a module of the test's: its classes make the marker when built


def _s(text: str) -> bytes:  # BINUNICODE
    data = text.encode()
    return b"X" + struct.pack("<I", len(data)) + data


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _stack_global(module: str, name: str) -> bytes:
    return _s(module) + _s(name) + b"\x93"


def forgeries(marker: Path) -> dict[str, bytes]:
    """{opcode route: a pickle that, run, makes the folder `marker`}."""
    p2, p4, arg, call = b"\x80\x02", b"\x80\x04", _s(str(marker)), b"\x85R."
    return {
        "GLOBAL": p2 + _global("os", "mkdir") + arg + call,
        "GLOBAL dotted": p4
        + _global("torch.distributed.checkpoint.filesystem", "os.mkdir")
        + arg
        + call,
        "STACK_GLOBAL dotted": p4
        + _stack_global("torch.distributed.checkpoint.filesystem", "os.mkdir")
        + arg
        + call,
        "STACK_GLOBAL dotted, metadata": p4
        + _stack_global("torch.distributed.checkpoint.metadata", "dataclasses.sys.modules")
        + b".",
        "STACK_GLOBAL dotted, pathlib": p4 + _stack_global("pathlib", "os.mkdir") + arg + call,
        "STACK_GLOBAL dotted, torch": p4 + _stack_global("torch", "os.mkdir") + arg + call,
        "INST": p2 + b"(" + arg + b"ios\nmkdir\n.",
        "OBJ": p2 + b"(" + _global("os", "mkdir") + arg + b"o.",
        "NEWOBJ": p2 + _global(HIT, "Hit") + arg + b"\x85\x81.",
        "NEWOBJ_EX": p4 + _stack_global(HIT, "Hit") + arg + b"\x85}\x92.",
        "BUILD": p2 + _global(HIT, "Quiet") + b")\x81}" + _s("x") + _s("y") + b"sb.",
        "EXT1": p2 + b"\x82" + bytes([EXT["EXT1"][0]]) + arg + call,
        "EXT2": p2 + b"\x83" + struct.pack("<H", EXT["EXT2"][0]) + arg + call,
        "EXT4": p2 + b"\x84" + struct.pack("<i", EXT["EXT4"][0]) + arg + call,
        "PERSID": p2 + b"P" + str(marker).encode() + b"\n.",
        "BINPERSID": p2
        + b"("
        + _s("storage")
        + _global("os", "mkdir")
        + arg
        + _s("cpu")
        + b"K\x01tQ.",
    }


def as_torch_file(pickled: bytes) -> bytes:
    """torch.save's zip format with `pickled` as its data.pkl."""
    plain = io.BytesIO()
    torch.save({"a": 1}, plain)
    forged = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(plain.getvalue())) as zin, zipfile.ZipFile(forged, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            zout.writestr(item, pickled if item.filename.endswith("/data.pkl") else data)
    return forged.getvalue()


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """The folder a forgery would make, the module whose classes would make it, and copyreg
    extension codes registered for callables that would make it."""
    mark = tmp_path / "it-ran"
    (tmp_path / "hit").mkdir()
    (tmp_path / "hit" / f"{HIT}.py").write_text(
        "import os\n"
        f"MARK = {str(mark)!r}\n"
        "class Hit:\n"
        "    def __new__(cls, *a, **k):\n"
        "        os.makedirs(MARK, exist_ok=True)\n"
        "        return object.__new__(cls)\n"
        "class Quiet:\n"
        "    def __setstate__(self, state):\n"
        "        os.makedirs(MARK, exist_ok=True)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "hit"))
    for code, (module, name) in EXT.values():
        copyreg.add_extension(module, name, code)
    yield mark
    for code, (module, name) in EXT.values():
        copyreg.remove_extension(module, name, code)


# ------------------------------------------------------------------ checkpoints to forge


def small_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def reseal(folder: Path) -> None:
    """The manifest rewritten to match the folder's files: what a forger does."""
    listed = json.loads((folder / integrity.MANIFEST).read_text())
    files = [folder / name for name in listed["files"]]
    files += [p for p in folder.glob("replica_rank*.pt") if p.name not in listed["files"]]
    listed["files"] = integrity.digests(files)
    (folder / integrity.MANIFEST).write_text(json.dumps(listed))


def forge(folder: Path, kind: str, pickled: bytes, monkeypatch) -> None:
    """`pickled` into the file of `kind` of the checkpoint `folder` (written anew for a value
    inside DCP's shards: the save's byte values replaced as they are written)."""
    if kind == ".metadata":
        (folder / ".metadata").write_bytes(pickled)
    elif kind == "value in a shard":
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
        from torch.distributed.checkpoint.planner import WriteItemType

        plain = DefaultSavePlanner.resolve_data

        def resolve_data(self, item):
            if item.type == WriteItemType.BYTE_IO:
                return io.BytesIO(as_torch_file(pickled))
            return plain(self, item)

        with monkeypatch.context() as m:
            m.setattr(DefaultSavePlanner, "resolve_data", resolve_data)
            model, optimizer = small_model()
            write(folder.parent, model, optimizer)
    else:  # paratrain's own files, in torch's zip format and as a bare (legacy) pickle
        name, form = kind.split(" ")
        (folder / name).write_bytes(as_torch_file(pickled) if form == "zip" else pickled)
    reseal(folder)


def write(directory: Path, model, optimizer) -> Path:
    return save_checkpoint(
        directory,
        model=model,
        optimizer=optimizer,
        scaler=None,
        state=LoopState(step=3),
        device=torch.device("cpu"),
        keep=0,
        replica={"model": model.state_dict()},
    )


KINDS = [
    ".metadata",
    "value in a shard",
    "train_state.pt zip",
    "train_state.pt bare",
    "rng_rank00000.pt zip",
    "replica_rank00000.pt zip",
    "replica_rank00000.pt bare",
]


def readers(folder: Path):
    """Every way paratrain reads a checkpoint in one process -> {name: call}."""

    def trainer_load():
        model, optimizer = small_model()
        load_checkpoint(
            folder, model=model, optimizer=optimizer, scaler=None, device=torch.device("cpu")
        )
        read_replica(folder, 0)

    return {
        "integrity check": lambda: integrity.problem(folder),
        "trainer's load": trainer_load,
        "read_checkpoint": lambda: read_checkpoint(folder),
    }


def reads(reader: str) -> list[str]:
    """The kinds of file a reader loads: the check only the metadata, a one-process read no
    replicas (sync modes' own, for a resumed rank)."""
    if reader == "integrity check":
        return [".metadata"]
    return [k for k in KINDS if reader != "read_checkpoint" or not k.startswith("replica")]


@pytest.mark.parametrize("kind", KINDS)
def test_a_forged_checkpoint_file_runs_nothing_and_is_refused_naming_it(
    tmp_path, marker, monkeypatch, kind
):
    model, optimizer = small_model()
    original = write(tmp_path / "ckpt", model, optimizer)
    assert integrity.problem(original) is None
    for route, pickled in forgeries(marker).items():
        folder = tmp_path / "ckpt" / "step_00000003"
        forge(folder, kind, pickled, monkeypatch)
        for reader, call in readers(folder).items():
            try:
                found = call()
            except UserError as e:
                found = str(e)
            assert not marker.exists(), f"{route} in {kind} ran code in the {reader}"
            if kind not in reads(reader):
                continue  # a file it does not read: it only must not run it
            assert found and "refused" in found and "\n" not in found, (route, kind, reader, found)
            named = ".metadata" if kind == ".metadata" else kind.split(" ")[0]
            assert named in found or kind == "value in a shard", (route, reader, found)


def test_a_refusal_names_the_global_a_forgery_asked_for(tmp_path, marker, monkeypatch):
    model, optimizer = small_model()
    folder = write(tmp_path / "ckpt", model, optimizer)
    original = (folder / ".metadata").read_bytes()
    forge(folder, ".metadata", forgeries(marker)["STACK_GLOBAL dotted"], monkeypatch)
    assert integrity.problem(folder) == (
        "step_00000003/.metadata asks for the global os.mkdir of "
        "torch.distributed.checkpoint.filesystem, which loading would run; refused"
    )
    forge(folder, ".metadata", original, monkeypatch)
    forge(folder, "train_state.pt zip", forgeries(marker)["GLOBAL"], monkeypatch)
    with pytest.raises(UserError, match="train_state.pt asks for unsupported GLOBAL os.mkdir"):
        read_checkpoint(folder)
    assert not marker.exists()


# ------------------------------------------------------------------ the commands themselves


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    """A real run folder (the tiny LM, 2 steps, a checkpoint at the end)."""
    out = tmp_path_factory.mktemp("forgery") / "run"
    train(
        load_config(
            None, [*TINY_LM, "train.max_steps=2", "lora.enabled=false", f"output_dir={out}"]
        )
    )
    return out


@pytest.mark.parametrize(
    ("kind", "route"),
    [
        (".metadata", "STACK_GLOBAL dotted"),
        ("value in a shard", "GLOBAL"),
        ("train_state.pt zip", "OBJ"),
        ("rng_rank00000.pt bare", "INST"),
    ],
)
def test_run_resume_and_export_of_a_forged_run_folder_run_nothing(
    lm_run, tmp_path, marker, monkeypatch, capsys, kind, route
):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(lm_run, out)
    newest = list_checkpoints(out / "checkpoints")[-1]
    if kind == "value in a shard":  # the run's own state, its byte values forged
        forge_run_values(newest, forgeries(marker)[route], monkeypatch)
    else:
        forge(newest, kind, forgeries(marker)[route], monkeypatch)
    code = main(["run", "--resume", str(out), "--set", "train.max_steps=4"])
    assert code == 2 and not marker.exists()
    one_error_line(capsys, "refused")
    code = main(["export", str(newest), str(tmp_path / "exported")])
    assert code == 2 and not marker.exists()
    one_error_line(capsys, "refused")
    assert not (tmp_path / "exported").exists()


def forge_run_values(folder: Path, pickled: bytes, monkeypatch) -> None:
    """A run's checkpoint written again from its own tensors with its byte values forged."""
    state = read_checkpoint(folder)
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.planner import WriteItemType

    plain = DefaultSavePlanner.resolve_data

    def resolve_data(self, item):
        if item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(as_torch_file(pickled))
        return plain(self, item)

    with monkeypatch.context() as m:
        m.setattr(DefaultSavePlanner, "resolve_data", resolve_data)
        dcp_save(
            {"model": state["model"], "optimizer": state["optimizer"]},
            checkpoint_id=folder,
            no_dist=True,
        )
    reseal(folder)
