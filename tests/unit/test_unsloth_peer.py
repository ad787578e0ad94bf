"""The Unsloth peer (issue 62, item 1): what it refuses to run, the folder of random weights it
writes for Unsloth to load (written whole or not at all, kept only under
PARATRAIN_RANDOM_WEIGHTS, and a folder that is not its own never loaded or touched), and the
program skipped where Unsloth is not installed. Unsloth's own training runs on the lent GPU
(benchmarks/device/unsloth_wheels.sh, recipes/bench/lora_speed.yaml)."""

import importlib.util
import json
import sys
import types

import pytest
import torch

from paratrain.bench.peers import unsloth_lora
from paratrain.config import load_config, to_yaml

RECIPE = "recipes/tiny_lora_cpu.yaml"
HAS_UNSLOTH = importlib.util.find_spec("unsloth") is not None


def cfg(*overrides):
    """The config as the peer reads it: resolved with levers=plain (common.read_plan)."""
    from paratrain.runplan import resolve

    c = load_config(RECIPE, ["precision=bf16", *overrides])
    c.levers = "plain"
    return resolve(c).config


@pytest.mark.parametrize(
    "overrides",
    [["precision=fp32"], ["model.kernels=liger"], ["train.compile=true"], ["lora.enabled=false"]],
)
def test_what_the_peer_cannot_run_exits_2_with_one_line(overrides, capsys):
    with pytest.raises(SystemExit) as stop:
        unsloth_lora.check_supported(cfg(*overrides))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unsloth_lora: runs LoRA" in err


def test_the_recipe_as_it_stands_is_accepted():
    unsloth_lora.check_supported(cfg())  # no exit


def test_random_weights_written_whole_then_reused_for_the_same_shape(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    c = cfg()
    folder = tmp_path / "rw"
    assert not unsloth_lora.reusable(folder, c)
    unsloth_lora.write_random_model(c, folder, torch.device("cpu"))
    assert not folder.with_name("rw.partial").exists()
    assert json.loads((folder / unsloth_lora.MARKER).read_text())["shape"] == "tiny"
    assert AutoConfig.from_pretrained(folder).model_type == "llama"
    assert AutoTokenizer.from_pretrained(folder)("ab")["input_ids"] == [97, 98]
    assert unsloth_lora.reusable(folder, c)
    with pytest.raises(SystemExit) as stop:  # another seed's folder is not this run's
        unsloth_lora.reusable(folder, cfg("seed=7"))
    assert stop.value.code == 2


def test_a_folder_that_is_not_the_peers_is_refused_and_left_as_it_was(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("a user's file")
    with pytest.raises(SystemExit) as stop:
        unsloth_lora.reusable(folder, cfg())
    assert stop.value.code == 2 and "not touched" in capsys.readouterr().err
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    partial = tmp_path / "rw.partial"
    partial.mkdir()
    (partial / "notes.txt").write_text("a user's file")
    with pytest.raises(SystemExit):  # a .partial the peer did not start is not touched either
        unsloth_lora.write_random_model(cfg(), tmp_path / "rw", torch.device("cpu"))
    assert [p.name for p in partial.iterdir()] == ["notes.txt"] and not (tmp_path / "rw").exists()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / unsloth_lora.MARKER).write_text("{not json")
    with pytest.raises(SystemExit) as stop:  # an unreadable marker: refused in one line
        unsloth_lora.reusable(tmp_path / "bad", cfg())
    assert stop.value.code == 2


def test_a_write_that_breaks_off_leaves_nothing_and_its_leftover_is_the_peers_to_remove(
    tmp_path, monkeypatch
):
    from paratrain.data.text import tokenizer

    class Broken:
        def save_pretrained(self, path):
            raise OSError("disk full")

    monkeypatch.setattr(tokenizer, "byte_tokenizer", lambda: Broken())
    with pytest.raises(OSError, match="disk full"):
        unsloth_lora.write_random_model(cfg(), tmp_path / "rw", torch.device("cpu"))
    assert list(tmp_path.iterdir()) == []  # its .partial removed, no folder
    monkeypatch.undo()
    partial = tmp_path / "rw.partial"  # what a killed write (timeout: -9) leaves
    partial.mkdir()
    (partial / unsloth_lora.WRITING).write_text("")
    (partial / "model.safetensors").write_text("half")
    unsloth_lora.write_random_model(cfg(), tmp_path / "rw", torch.device("cpu"))
    assert not partial.exists() and unsloth_lora.reusable(tmp_path / "rw", cfg())
    assert not (tmp_path / "rw" / unsloth_lora.WRITING).exists()


def run_main(tmp_path, monkeypatch, *overrides):
    """The peer's main on the tiny recipe, Unsloth stood in for by an empty module and its
    loading by a function that records the folder and stops the run."""
    from paratrain.bench.peers import common

    monkeypatch.setattr(common, "require", lambda name: None)
    monkeypatch.setitem(sys.modules, "unsloth", types.ModuleType("unsloth"))
    seen = []

    def load(c, folder):
        seen.append(folder)
        assert (folder / "model.safetensors").is_file()
        raise RuntimeError("stop after loading")

    monkeypatch.setattr(unsloth_lora, "load_with_lora", load)
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(load_config(RECIPE, ["precision=bf16", "launch.nproc=1", *overrides])))
    monkeypatch.setattr(sys, "argv", ["unsloth_lora", str(path), str(tmp_path / "run")])
    with pytest.raises(RuntimeError, match="stop after loading"):
        unsloth_lora.main()
    return seen[0]


def test_the_weights_are_removed_after_loading_unless_kept(tmp_path, monkeypatch):
    folder = run_main(tmp_path, monkeypatch)
    assert folder == tmp_path / "run" / unsloth_lora.WEIGHTS and not folder.exists()
    monkeypatch.setenv("PARATRAIN_RANDOM_WEIGHTS", str(tmp_path / "kept"))
    assert run_main(tmp_path, monkeypatch) == tmp_path / "kept"
    assert (tmp_path / "kept" / unsloth_lora.MARKER).is_file()  # there for the next row


def test_more_than_one_process_is_refused_before_unsloth_is_imported(tmp_path, monkeypatch, capsys):
    from paratrain.bench.peers import common

    monkeypatch.setattr(common, "require", lambda name: None)
    monkeypatch.setitem(sys.modules, "unsloth", None)  # importing it would raise
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(load_config(RECIPE, ["precision=bf16", "launch.nproc=2"])))
    monkeypatch.setattr(sys, "argv", ["unsloth_lora", str(path), str(tmp_path / "run")])
    with pytest.raises(SystemExit) as stop:
        unsloth_lora.main()
    assert stop.value.code == 2 and "launch.nproc=1" in capsys.readouterr().err


@pytest.mark.skipif(HAS_UNSLOTH, reason="unsloth is installed here")
def test_peer_is_skipped_without_unsloth(tmp_path, monkeypatch, capsys):
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg()))
    monkeypatch.setattr(sys, "argv", ["unsloth_lora", str(path), str(tmp_path)])
    with pytest.raises(SystemExit) as stop:
        unsloth_lora.main()
    assert stop.value.code == 3
    assert "skipped: unsloth is not installed" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_a_peer_run_whose_loss_stops_being_a_number_is_stored_failed(tmp_path, monkeypatch):
    """Unsloth at batch 8 on the lent H100 (2026-12-07) trained on with a NaN loss from step 30
    and exited 0: such a run's speed is kept in its metrics, the row says why it failed."""
    from paratrain.bench import execute
    from paratrain.bench.sweep import RunSpec

    losses = "[3.0, 2.5, float('nan'), 2.0]"
    script = (
        "import json, pathlib, sys; "
        f"s = {{'unique_samples_per_s': 9.0, 'losses': {losses}}}; "
        "pathlib.Path(sys.argv[1], 'result.json').write_text(json.dumps({'summary': s}))"
    )
    monkeypatch.setattr(
        execute, "command_for", lambda run, d: [sys.executable, "-c", script, str(d)]
    )
    run = RunSpec("s", "peer", "unsloth_lora", {}, [], cfg(), 0)
    row = execute.execute_run(run, tmp_path / "run", timeout_s=60)
    assert row.status == "failed" and row.error == "loss not a finite number from step 3 of 4"
    assert row.unique_samples_per_s == 9.0 and row.result["curve"][-1][0] == 2
