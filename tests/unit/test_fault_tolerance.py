"""Fault tolerance in one process: checkpoints verified against their manifest (a damaged newest
one is named and the previous used), checkpoints that lack or add tensors refused, loading that
runs no code, one run per folder, non-finite steps skipped and counted, strict result.json."""

import json
import os
import pickle
import shutil

import pytest
from conftest import TINY_LM, final_weights, max_abs_diff, one_error_line, read_result, train

from paratrain.checkpoint import list_checkpoints
from paratrain.cli import main
from paratrain.config import load_config
from paratrain.meters.metrics import write_json
from paratrain.trainer import faults

LM = [*TINY_LM, "data.batch_size=4", "lora.enabled=false", "checkpoint.every_steps=2"]


def run(out, *settings):
    return train(load_config(None, [*LM, *settings, f"output_dir={out}"]))


def cli(out, *settings):
    args = [a for s in [*LM, *settings] for a in ("--set", s)]
    return main(["run", *args, "--output-dir", str(out)])


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory):
    """A 4-step run (checkpoints at 2 and 4) and a straight 6-step one, for comparisons."""
    base = tmp_path_factory.mktemp("ft")
    run(base / "four", "train.max_steps=4")
    run(base / "six", "train.max_steps=6")
    return base


def copy_run(four_steps, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(four_steps / "four", out)
    return out


@pytest.mark.parametrize("damage", ["truncate", "flip", "manifest"])
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_resumes(
    four_steps, tmp_path, capsys, damage
):
    out = copy_run(four_steps, tmp_path)
    newest = list_checkpoints(out / "checkpoints")[-1]
    shard = newest / "__0_0.distcp"
    data = shard.read_bytes()
    if damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        shard.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:  # a folder that never got its manifest (a crash mid-save, before the rename)
        (newest / "manifest.json").unlink()
    result = run(out, "train.max_steps=6", "checkpoint.resume=auto")
    printed = capsys.readouterr().out
    assert "checkpoint skipped: step_00000004" in printed
    assert "resumed from" in printed and "step_00000002 at step 2" in printed
    assert result["summary"]["steps_this_run"] == 4
    # the same steps from the same state: the run equals one straight to step 6, bit for bit
    assert max_abs_diff(final_weights(out), final_weights(four_steps / "six")) == 0


def test_a_damaged_checkpoint_named_explicitly_is_one_line(four_steps, tmp_path, capsys):
    out = copy_run(four_steps, tmp_path)
    newest = list_checkpoints(out / "checkpoints")[-1]
    (newest / "train_state.pt").write_bytes(b"garbage")
    code = cli(tmp_path / "again", "train.max_steps=6", f"checkpoint.resume={newest}")
    assert code == 2
    one_error_line(capsys, "train_state.pt has 7 bytes, the manifest says")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (["model.layers=3"], "lacks 9 of this model's tensors (model.layers.2."),
        (["model.layers=1"], "holds 9 tensors this model does not have (model.layers.1."),
        (["lora.enabled=true"], "lacks 12 of this model's tensors (base_model.model."),
        (["train.optimizer=sgd"], "lacks optimizer state for this run"),
    ],
    ids=["lacks", "adds", "lora", "optimizer"],
)
def test_a_checkpoint_of_another_model_is_refused_naming_tensors(
    four_steps, tmp_path, capsys, settings, message
):
    newest = list_checkpoints(four_steps / "four" / "checkpoints")[-1]
    code = cli(tmp_path / "other", "train.max_steps=6", f"checkpoint.resume={newest}", *settings)
    assert code == 2
    one_error_line(capsys, message)


class SideEffect:
    """Unpickling this would create a file: what a malicious checkpoint does."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.makedirs, (self.path,))


@pytest.mark.parametrize("where", [".metadata", "train_state.pt"])
def test_loading_a_checkpoint_runs_no_code_from_it(four_steps, tmp_path, capsys, where):
    out = copy_run(four_steps, tmp_path)
    newest = list_checkpoints(out / "checkpoints")[-1]
    marker = tmp_path / "it-ran"
    (newest / where).write_bytes(pickle.dumps(SideEffect(str(marker))))
    # a manifest that matches: the author of a malicious checkpoint writes one too
    listed = json.loads((newest / "manifest.json").read_text())
    from paratrain.checkpoint.integrity import digests

    listed["files"].update(digests([newest / where]))
    (newest / "manifest.json").write_text(json.dumps(listed))
    code = cli(tmp_path / "victim", "train.max_steps=6", f"checkpoint.resume={newest}")
    assert code == 2
    one_error_line(capsys, "refused")
    assert not marker.exists()


def test_a_fresh_run_into_another_runs_folder_is_refused_and_touches_nothing(
    four_steps, tmp_path, capsys
):
    out = copy_run(four_steps, tmp_path)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
    assert cli(out, "train.max_steps=6") == 2
    one_error_line(capsys, "holds an earlier run (config.yaml, ", "checkpoints/step_00000004)")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before


def test_a_non_finite_step_is_skipped_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(faults, "_FAULTS", faults.parse("nan:step=2"))
    result = run(tmp_path / "nan", "train.max_steps=4")
    s = result["summary"]
    assert s["skipped_steps"] == [2] and s["optimizer_steps"] == 4
    strict = json.loads(
        (tmp_path / "nan" / "result.json").read_text(),
        parse_constant=lambda c: pytest.fail(f"{c} in result.json"),
    )
    assert strict["summary"]["train_loss"] > 0  # the skipped step's NaN is not in the mean


@pytest.mark.parametrize("fused", [False, True], ids=["clip-then-step", "clip-in-kernel"])
def test_a_non_finite_step_under_clipping_is_skipped(tmp_path, monkeypatch, fused):
    """With train.max_grad_norm the guard reads the clip's global norm (NaN anywhere makes it
    NaN) instead of a second pass over the gradients: the NaN step is still skipped."""
    monkeypatch.setattr(faults, "_FAULTS", faults.parse("nan:step=2"))
    settings = ["train.max_steps=4", "train.max_grad_norm=0.5", f"train.fused_optimizer={fused}"]
    result = run(tmp_path / "nan", *settings)
    assert result["summary"]["skipped_steps"] == [2]
    assert all(v.isfinite().all() for v in final_weights(tmp_path / "nan").values())


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_fused_optimizer_skips_on_the_device_flag_as_the_host_check_does(
    tmp_path, monkeypatch, optimizer
):
    """With a fused optimizer the guard's verdict stays on the device (no host read per step):
    the kernel skips step 3's update on the flag, and the host learns of it a step later. The
    result equals the host check's (foreach kernels, the same update to rounding); SGD with
    momentum takes the host check until its buffers exist (step 1), the flag after."""
    from paratrain.trainer import step as step_module

    monkeypatch.setattr(faults, "_FAULTS", faults.parse("nan:step=3"))
    settings = ["train.max_steps=4", f"train.optimizer={optimizer}"]
    host = run(tmp_path / "host", *settings)
    checks = []
    host_check = step_module.finite_everywhere
    monkeypatch.setattr(
        step_module, "finite_everywhere", lambda *a: checks.append(1) or host_check(*a)
    )
    device = run(tmp_path / "device", *settings, "train.fused_optimizer=true")
    assert checks == ([1] if optimizer == "sgd" else [])  # SGD: step 1 before its buffers
    for result in (host, device):
        assert result["summary"]["skipped_steps"] == [3]
    a, b = final_weights(tmp_path / "host"), final_weights(tmp_path / "device")
    assert all(v.isfinite().all() for v in b.values())
    assert max_abs_diff(a, b) < 1e-5
    assert abs(host["summary"]["train_loss"] - device["summary"]["train_loss"]) < 1e-5


@pytest.mark.parametrize("fused", [False, True], ids=["host-check", "device-flag"])
def test_a_diverging_run_stops_with_one_line(tmp_path, capsys, fused):
    settings = ["train.max_steps=8", "train.lr=1e10", f"train.fused_optimizer={fused}"]
    assert cli(tmp_path / "boom", *settings) == 2
    one_error_line(capsys, "non-finite loss or gradient", "Last checkpoint: ")
    assert not (tmp_path / "boom" / "result.json").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_non_finite_numbers_are_refused_before_anything_runs(tmp_path, capsys, value):
    assert cli(tmp_path / "x", f"train.lr={value}") == 2
    one_error_line(capsys, "train.lr: expected a finite number")
    assert not (tmp_path / "x").exists()


def test_result_json_is_strict_with_non_finite_values_named(tmp_path):
    write_json(tmp_path / "r.json", {"summary": {"loss": float("nan"), "ok": 1.0}})
    got = json.loads((tmp_path / "r.json").read_text())
    assert got == {"summary": {"loss": None, "ok": 1.0}, "nonfinite": ["summary.loss"]}


def test_a_restarted_generation_without_a_checkpoint_starts_over(four_steps, tmp_path, monkeypatch):
    """TORCHELASTIC_RESTART_COUNT > 0: the agent restarted the workers. With no checkpoint yet
    they start from step 0 in their own folder; with one, from the newest."""
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    (tmp_path / "fresh").mkdir()
    assert run(tmp_path / "fresh", "train.max_steps=2")["summary"]["steps_this_run"] == 2
    out = copy_run(four_steps, tmp_path)
    assert run(out, "train.max_steps=6")["summary"]["steps_this_run"] == 2
    assert read_result(out)["summary"]["optimizer_steps"] == 6


def test_an_async_checkpoint_equals_a_waited_one_and_appears_complete(four_steps, tmp_path):
    """checkpoint.async_mode=async: the same tensors, loop state and manifest-checked files as
    the run that waited for each save; nothing half-written is left behind."""
    from paratrain.checkpoint import read_checkpoint
    from paratrain.checkpoint.integrity import problem

    out = tmp_path / "async"
    result = run(out, "train.max_steps=4", "checkpoint.async_mode=async")
    assert result["summary"]["checkpoint"]["async_mode"] == "async"
    assert result["summary"]["checkpoint"]["saves"] == 2
    written = list_checkpoints(out / "checkpoints")
    assert [p.name for p in written] == ["step_00000002", "step_00000004"]
    assert not list((out / "checkpoints").glob(".*"))
    waited_for = list_checkpoints(four_steps / "four" / "checkpoints")
    for mine, waited in zip(written, waited_for, strict=True):
        assert problem(mine) is None
        a, b = read_checkpoint(mine), read_checkpoint(waited)
        assert a["loop"] == b["loop"]
        assert max_abs_diff(a["model"], b["model"]) == 0.0
        assert a["optimizer"].keys() == b["optimizer"].keys()


def test_resuming_a_finished_run_or_a_missing_path_is_one_line(four_steps, tmp_path, capsys):
    done = four_steps / "four" / "checkpoints" / "step_00000004"
    assert cli(tmp_path / "again", "train.max_steps=4", f"checkpoint.resume={done}") == 2
    one_line = one_error_line(capsys, "nothing to train", "train.max_steps")
    assert "step 4" in one_line
    assert cli(tmp_path / "gone", f"checkpoint.resume={tmp_path / 'nowhere'}") == 2
    one_error_line(capsys, "does not exist")
    assert not (tmp_path / "gone").exists()  # refused before anything was written
