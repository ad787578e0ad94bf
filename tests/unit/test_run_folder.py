"""One run per folder (launch/runfolder/): a fresh run into a folder that holds an earlier run is
refused in one line before anything is written, unless it resumes it or replaces it
(--overwrite, paratrain.train(overwrite=True)); a run writes into its folder once its first step
has run, so a mistake found before it (a damaged image in the first batch, a model that does
not fit its data) leaves the folder as it was."""

import json

import numpy as np
import pytest
from conftest import RECIPES, TINY_LM, one_error_line
from PIL import Image

import paratrain
from paratrain.cli import main

TINY = str(RECIPES / "tiny_cpu.yaml")
QUICK = ["strategy=single", "train.max_steps=2", "log.progress=false", "log.every_steps=1"]


def run(out, *settings, flags=()):
    args = [a for s in [*QUICK, *settings] for a in ("--set", s)]
    return main(["run", TINY, *args, "--output-dir", str(out), *flags])


def snapshot(folder):
    """Every file under folder with its bytes: what 'nothing changed' is checked against."""
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def events(folder):
    return sorted((folder / "tensorboard").glob("events.out.tfevents.*"))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step run without checkpoints (checkpoint.at_end=false)."""
    out = tmp_path_factory.mktemp("folders") / "finished"
    assert run(out, "checkpoint.at_end=false") == 0
    return out


def copy_of(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_a_fresh_run_into_a_finished_run_without_checkpoints_is_refused(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path / "run")
    before = snapshot(out)
    assert run(out) == 2
    err = one_error_line(capsys, f"{out} holds an earlier run", "--resume", "--overwrite")
    assert "config.yaml, plan.json, result.json, steps.jsonl" in err
    assert snapshot(out) == before
    # with its checkpoints elsewhere (checkpoint.dir): the same
    assert run(out, f"checkpoint.dir={tmp_path / 'elsewhere'}") == 2
    one_error_line(capsys, "holds an earlier run")
    assert snapshot(out) == before and not (tmp_path / "elsewhere").exists()
    # paratrain.train: the same line, as UserError
    with pytest.raises(paratrain.UserError, match="holds an earlier run"):
        paratrain.train(TINY, {**dict(s.split("=", 1) for s in QUICK), "output_dir": str(out)})
    assert snapshot(out) == before


def test_an_empty_folder_or_one_of_other_files_is_no_earlier_run(tmp_path):
    (tmp_path / "empty").mkdir()
    assert run(tmp_path / "empty") == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    (other / "config.yaml").write_text("task: image_classification\n")  # a config alone
    assert run(other) == 0
    assert (other / "notes.txt").read_text() == "mine" and (other / "result.json").is_file()


def test_overwrite_replaces_the_earlier_runs_files_and_leaves_others(finished, tmp_path, capsys):
    out = copy_of(finished, tmp_path / "run")
    (out / "notes.txt").write_text("mine")
    (out / "samples").mkdir()
    (out / "samples" / "mine.txt").write_text("mine too")  # in a folder a run writes
    old = json.loads((out / "result.json").read_text())
    assert run(out, "train.max_steps=3", flags=["--overwrite"]) == 0
    said = capsys.readouterr().out
    assert "--overwrite: the earlier run's " in said and "set aside" in said
    new = json.loads((out / "result.json").read_text())
    assert old["summary"]["optimizer_steps"] == 2 and new["summary"]["optimizer_steps"] == 3
    steps = [json.loads(x)["step"] for x in (out / "steps.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]  # this run's points alone
    assert len(events(out)) == 1  # TensorBoard holds one run
    assert [p.name for p in sorted((out / "checkpoints").glob("step_*"))] == ["step_00000003"]
    assert (out / "notes.txt").read_text() == "mine"
    assert (out / "samples" / "mine.txt").read_text() == "mine too"
    assert not (out / ".paratrain" / "overwritten").exists()  # gone with the first checkpoint
    # resume and overwrite contradict each other: one line, nothing changed
    before = snapshot(out)
    assert run(out, "train.max_steps=4", flags=["--overwrite", "--resume", str(out)]) == 2
    one_error_line(capsys, "--overwrite", "checkpoint.resume")
    assert snapshot(out) == before


def test_overwrite_leaves_another_runs_checkpoints_in_a_shared_checkpoint_dir(
    finished, tmp_path, capsys
):
    out = copy_of(finished, tmp_path / "run")
    ckpts = tmp_path / "ckpts"  # another run's checkpoints in this run's checkpoint.dir
    assert run(tmp_path / "other", f"checkpoint.dir={ckpts}") == 0
    before, theirs = snapshot(out), snapshot(ckpts)
    capsys.readouterr()
    assert run(out, "train.max_steps=3", f"checkpoint.dir={ckpts}", flags=["--overwrite"]) == 2
    one_error_line(capsys, f"{ckpts} also holds another run's checkpoints (step_00000002)")
    assert snapshot(out) == before and snapshot(ckpts) == theirs


def test_a_failed_overwrite_leaves_the_earlier_run_whole(finished, tmp_path, capsys):
    """The new run fails before its first checkpoint (a mistake after the checks, in its
    third step): the earlier run's files are back as they were, the new run's gone."""
    out = copy_of(finished, tmp_path / "run")
    (out / "samples").mkdir()
    (out / "samples" / "mine.txt").write_text("mine")
    before = snapshot(out)
    from paratrain.trainer import faults

    faults._FAULTS = faults.parse("raise:step=3")
    try:
        with pytest.raises(RuntimeError):
            run(out, "train.max_steps=4", "checkpoint.every_steps=0", flags=["--overwrite"])
    finally:
        faults._FAULTS = []
    assert {p: b for p, b in snapshot(out).items() if "errors" not in p.parts} == before


def test_paratrain_train_overwrites_when_asked(finished, tmp_path):
    out = copy_of(finished, tmp_path / "run")
    given = {**dict(s.split("=", 1) for s in QUICK), "output_dir": str(out)}
    result = paratrain.train(TINY, {**given, "train.max_steps": 3}, overwrite=True)
    assert result["summary"]["optimizer_steps"] == 3 and len(events(out)) == 1


# ---------------------------------------------------------------- a mistake before the first step


def image_folder(root, damaged=False):
    """Two classes of small PNGs; damaged: every file's pixel stream replaced by bytes that are
    not zlib, its chunk checksums made right again (it passes preflight's structure check,
    data/images.py; its pixels do not decode), so the first batch fails."""
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (root / cls).mkdir(parents=True, exist_ok=True)
        for i in range(6):
            path = root / cls / f"{i}.png"
            Image.fromarray(rng.integers(0, 255, (20, 30, 3), dtype=np.uint8)).save(path)
            if damaged:
                path.write_bytes(garbled_pixels(path.read_bytes()))
    return root


def garbled_pixels(png: bytes) -> bytes:
    """The PNG with each IDAT chunk's data overwritten by 0xff bytes (not a zlib stream) and
    its CRC recomputed."""
    import struct
    import zlib

    out, at = bytearray(png[:8]), 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, body = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        if kind == b"IDAT":
            body = b"\xff" * length
        out += struct.pack(">I", length) + kind + body
        out += struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)
        at += 12 + length
    return bytes(out)


IMAGES = ["data.source=imagefolder", "data.image_size=16", "data.batch_size=2"]


def test_a_damaged_image_in_the_first_batch_leaves_no_folder(tmp_path, capsys):
    images = image_folder(tmp_path / "images", damaged=True)
    out = tmp_path / "run"
    assert run(out, *IMAGES, f"data.path={images}") == 2
    one_error_line(capsys, "data.path", "is not an image that can be read")
    assert not out.exists()
    # a folder given with other files in it: left as it was
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert run(other, *IMAGES, f"data.path={images}") == 2
    one_error_line(capsys, "is not an image that can be read")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_a_resume_that_fails_before_its_first_step_changes_nothing(tmp_path, capsys):
    images = image_folder(tmp_path / "images")
    out = tmp_path / "run"
    assert run(out, *IMAGES, f"data.path={images}") == 0
    before = snapshot(out)
    image_folder(images, damaged=True)
    assert main(["run", "--resume", str(out), "--set", "train.max_steps=4"]) == 2
    one_error_line(capsys, "is not an image that can be read")
    assert snapshot(out) == before  # config.yaml, plan.json, the step log, TensorBoard


def test_a_model_shorter_than_its_rows_is_refused_before_anything_runs(tmp_path, capsys):
    """GPT-2 learns one embedding per position: a row longer than its n_positions would be an
    index past the table in the first step; refused before any process starts."""
    out = tmp_path / "gpt2"
    lm = [*TINY_LM, "model.shape=tiny-gpt2", "lora.enabled=false", "data.batch_size=2"]
    args = [a for s in [*lm, "train.max_steps=2", "data.max_length=600"] for a in ("--set", s)]
    assert main(["run", *args, "--output-dir", str(out)]) == 2
    one_error_line(capsys, "data.max_length: 600 exceeds the model's 512 positions")
    assert not out.exists()


def test_a_restarted_generation_writes_the_folder_the_first_did_not(tmp_path, monkeypatch):
    """A first generation that failed before its first step wrote nothing: the restarted one
    writes config.yaml and plan.json (what --resume reads) once its own first step has run."""
    from conftest import train

    from paratrain.config import load_config

    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    out = tmp_path / "restarted"
    train(load_config(TINY, [*QUICK, f"output_dir={out}"]))
    assert (out / "config.yaml").is_file() and (out / "plan.json").is_file()


@pytest.mark.dist
def test_two_processes_failing_in_their_first_step_leave_no_folder(tmp_path, capsys):
    """The workers' mistake said once by the launching command; the folder it made for the
    run is removed again, an earlier run's files beside it stay as they were."""
    images = image_folder(tmp_path / "images", damaged=True)
    out = tmp_path / "run"
    two = ["strategy=ddp-ds", "launch.nproc=2"]
    assert run(out, *IMAGES, *two, f"data.path={images}") == 2
    one_error_line(capsys, "is not an image that can be read")
    assert not out.exists()
