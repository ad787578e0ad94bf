"""A checkpoint that is damaged or hand-edited rather than forged to run code: each is named in
one line (a UserError, or integrity.problem's line), never a traceback from deep inside a load.
And the two ways a well-formed one could still reach past its folder or DCP's unsafe load:
storage entries that point outside the folder, byte values loaded a second time without
weights_only."""

import io
import json
import pickle
import tarfile
from pathlib import Path

import pytest
import torch
from test_checkpoint_forgery import reseal, small_model, write

from paratrain.checkpoint import integrity, load_checkpoint, read_checkpoint
from paratrain.errors import UserError


@pytest.fixture
def folder(tmp_path) -> Path:
    model, optimizer = small_model()
    found = write(tmp_path / "ckpt", model, optimizer)
    assert integrity.problem(found) is None
    return found


def resume(folder: Path) -> None:
    """The trainer's load into a model like the writer's."""
    model, optimizer = small_model()
    load_checkpoint(
        folder, model=model, optimizer=optimizer, scaler=None, device=torch.device("cpu")
    )


def refused(call, *needles) -> str:
    with pytest.raises(UserError) as caught:
        call()
    line = str(caught.value)
    assert "\n" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


def saved(value) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def legacy_tar() -> bytes:
    """torch's pre-1.6 tar format (torch.load(weights_only=True) refuses it with a
    RuntimeError)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for member in ("sys_info", "pickle", "storages", "tensors"):
            data = pickle.dumps({"protocol_version": 1001}, 2)
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def torchscript() -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(1, 1)), buf)
    return buf.getvalue()


# ------------------------------------------------------------------ files that do not load


@pytest.mark.parametrize("form", ["empty", "cut short", "legacy tar", "TorchScript"])
@pytest.mark.parametrize("name", ["train_state.pt", "rng_rank00000.pt"])
def test_a_file_that_does_not_load_is_named_unreadable(folder, name, form):
    good = (folder / name).read_bytes()
    make = {
        "empty": lambda: b"",
        "cut short": lambda: good[: len(good) // 2],
        "legacy tar": legacy_tar,
        "TorchScript": torchscript,
    }
    (folder / name).write_bytes(make[form]())
    reseal(folder)
    refused(lambda: resume(folder), f"{name} is unreadable (")
    if name == "train_state.pt":
        refused(lambda: read_checkpoint(folder), f"{name} is unreadable (")


# ------------------------------------------------------------------ train_state.pt's shape


def _state(folder: Path) -> dict:
    return torch.load(folder / "train_state.pt", weights_only=True)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda s: s["loop"].update(evil=1), "loop holds keys of no loop state (evil)"),
        (lambda s: s.clear(), "world_size is None"),
        (lambda s: s["loop"].pop("step"), "loop has no step"),
        (lambda s: s["loop"].update(step="x"), "loop.step is 'x', not a count"),
        (lambda s: s["loop"].update(bad_steps=[1, "x"]), "loop.bad_steps"),
        (lambda s: s["loop"].update(losses={"epochs": 5}), "loop.losses.epochs"),
        (lambda s: s["loop"].update(losses={"sums": [1.0], "epoch": 0}), "loop.losses.good"),
        (lambda s: s.update(scaler={"scale": "big"}), "scaler is not a loss scaler's state"),
        (lambda s: s.update(layout=[1]), "layout is not a dict"),
        (lambda s: s.update(world_size=0), "world_size is 0"),
    ],
)
def test_a_train_state_of_another_shape_is_refused_before_use(folder, change, said):
    state = _state(folder)
    state["loop"] = dict(state["loop"])
    change(state)
    (folder / "train_state.pt").write_bytes(saved(state))
    reseal(folder)
    refused(lambda: resume(folder), "train_state.pt: ", said, "refused")
    refused(lambda: read_checkpoint(folder), "train_state.pt: ", said)


def test_a_train_state_that_is_a_list_is_refused(folder):
    (folder / "train_state.pt").write_bytes(saved([1, 2, 3]))
    reseal(folder)
    refused(lambda: resume(folder), "train_state.pt: a list, not a dict")


def test_a_refused_train_state_leaves_the_model_as_it_was(folder):
    state = _state(folder)
    state["loop"] = {**state["loop"], "step": -1}
    (folder / "train_state.pt").write_bytes(saved(state))
    reseal(folder)
    model, optimizer = small_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.nn.init.zeros_(model[0].weight)
    with pytest.raises(UserError, match="loop.step is -1"):
        load_checkpoint(
            folder, model=model, optimizer=optimizer, scaler=None, device=torch.device("cpu")
        )
    assert torch.equal(model[0].weight, torch.zeros_like(before["0.weight"]))


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            lambda s: s.update(numpy=["MT19937", torch.zeros(3, dtype=torch.int64), 0, 0, 0.0]),
            "numpy",
        ),
        (lambda s: s.update(numpy=[1, 2]), "numpy"),
        (lambda s: s.update(torch=torch.zeros(7, dtype=torch.uint8)), "torch state has 7 bytes"),
        (lambda s: s.update(torch="x"), "its torch state"),
        (lambda s: s.update(python=(3, (1, 2), None)), "python"),
        (lambda s: s.pop("python"), "python"),
    ],
)
def test_a_random_state_of_another_shape_is_refused(folder, change, said):
    state = torch.load(folder / "rng_rank00000.pt", weights_only=True)
    change(state)
    (folder / "rng_rank00000.pt").write_bytes(saved(state))
    reseal(folder)
    refused(lambda: resume(folder), "rng_rank00000.pt: ", said, "refused")


def test_a_good_checkpoint_still_resumes_with_its_random_state(folder):
    torch.manual_seed(123)
    resume(folder)  # same writer's layout: its random state continues
    state = torch.load(folder / "rng_rank00000.pt", weights_only=True)
    assert torch.equal(torch.get_rng_state(), state["torch"])


# ------------------------------------------------------------------ manifest.json's shape


@pytest.mark.parametrize(
    "files",
    [
        [],
        {"train_state.pt": 5},
        {"train_state.pt": {"bytes": "5", "sha256": "0"}},
        {"train_state.pt": {"bytes": 5}},
        {"../../config.yaml": {"bytes": 1, "sha256": "0"}},
        "x",
    ],
)
def test_a_manifest_of_another_shape_is_named(folder, files):
    body = json.loads((folder / integrity.MANIFEST).read_text())
    body["files"] = files
    (folder / integrity.MANIFEST).write_text(json.dumps(body))
    assert integrity.problem(folder) == "step_00000003/manifest.json is not a paratrain manifest"


# ------------------------------------------------------------------ .metadata


def _metadata(folder: Path):
    return integrity.read_metadata(folder / ".metadata")


def _rewrite(folder: Path, metadata) -> None:
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))
    reseal(folder)


def test_a_damaged_metadata_is_unreadable_not_a_request(folder):
    good = (folder / ".metadata").read_bytes()
    (folder / ".metadata").write_bytes(good[: len(good) // 2])
    reseal(folder)
    found = integrity.problem(folder)
    assert found.startswith("step_00000003/.metadata is unreadable (UnpicklingError"), found
    assert "asks for" not in found
    (folder / ".metadata").write_bytes(pickle.dumps([1, 2]))
    reseal(folder)
    assert integrity.problem(folder) == "step_00000003/.metadata holds a list, not DCP's metadata"


def test_a_tensor_declared_as_a_value_is_refused(folder):
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    meta = _metadata(folder)
    key = next(k for k in meta.storage_data if k.fqn == "model.1.weight")
    info = meta.storage_data.pop(key)
    shard = folder / info.relative_path
    info.offset, info.length = shard.stat().st_size, len(saved({"a": 1}))
    with open(shard, "ab") as f:
        f.write(saved({"a": 1}))
    meta.storage_data[MetadataIndex("model.1.weight")] = info
    meta.state_dict_metadata["model.1.weight"] = BytesStorageMetadata()
    _rewrite(folder, meta)
    refused(lambda: resume(folder), "holds 1 of this run's tensors as other values (1.weight)")


@pytest.mark.parametrize("where", ["absolute", "parent", "unlisted"])
def test_metadata_reading_a_file_outside_the_checkpoint_is_refused(folder, tmp_path, where):
    outside = tmp_path / "elsewhere.distcp"
    meta = _metadata(folder)
    key = next(k for k in meta.storage_data if k.fqn == "model.1.weight")
    (outside if where != "unlisted" else folder / "extra.distcp").write_bytes(
        (folder / meta.storage_data[key].relative_path).read_bytes()
    )
    meta.storage_data[key].relative_path = {
        "absolute": str(outside),
        "parent": "../../elsewhere.distcp",
        "unlisted": "extra.distcp",
    }[where]
    _rewrite(folder, meta)
    found = integrity.problem(folder)
    assert found and found.endswith("refused") and "model.1.weight" in found, found
    if where != "unlisted":
        assert "outside the checkpoint's folder" in found
    else:
        assert "a file its manifest.json does not list" in found
    refused(lambda: resume(folder), "model.1.weight", "refused")
    refused(lambda: read_checkpoint(folder), "model.1.weight", "refused")
    # DCP's own load through paratrain's reader, without the checks before it
    import torch.distributed.checkpoint as dcp

    model, _ = small_model()
    wanted = {"model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()}}
    planner, _ = integrity.safe_planners()
    with pytest.raises(integrity.UnsafeCheckpoint), integrity.unwrapped():
        dcp.load(
            wanted, storage_reader=integrity.safe_reader(folder), planner=planner(), no_dist=True
        )


# ------------------------------------------------------------------ byte values: read once


@pytest.fixture
def loads(monkeypatch) -> list:
    """Every torch.load's weights_only, as called."""
    calls = []
    plain = torch.load

    def load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return plain(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    return calls


def test_byte_values_are_loaded_once_and_only_with_weights_only(folder, loads):
    state = read_checkpoint(folder)
    resume(folder)
    assert loads and all(w is True for w in loads), loads
    lrs = [v for k, v in state["optimizer"].items() if k.endswith(".lr")]
    assert lrs and all(lr == 1e-3 for lr in lrs)


def test_byte_values_load_as_before_where_dcp_keeps_them_elsewhere(folder, monkeypatch):
    """A torch whose planner lacks what the safe planners store into: checked, then DCP's own."""
    import torch.distributed.checkpoint._traverse as traverse

    monkeypatch.delattr(traverse, "set_element")
    state = read_checkpoint(folder)
    assert [v for k, v in state["optimizer"].items() if k.endswith(".lr")][0] == 1e-3
    resume(folder)
