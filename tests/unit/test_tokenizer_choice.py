"""model.tokenizer: your own model without a tokenizer trains with paratrain's byte tokenizer
(`model.tokenizer=bytes`, nothing downloaded or trained), and a folder without one is refused
before any worker starts when the run would take the folder's own."""

import json
import types

import pytest
import torch
from test_run_plan import LORA_RECIPE, QUICK, hf_model, losses

from paratrain.cli import main
from paratrain.data.text.encoder import encoder_tokenizer
from paratrain.data.text.tokenizer import BYTE_SPECIALS, check_tokenizer, load_tokenizer
from paratrain.errors import UserError
from paratrain.tasks.causal_lm import check_byte_ids


def bare_model(folder):
    """A tiny Llama saved without any tokenizer (a model of one's own making)."""
    from paratrain.models.causal_lm.build import build_causal_lm

    torch.manual_seed(7)
    build_causal_lm(None, "random", "tiny", "sdpa", torch.float32).save_pretrained(folder)
    return folder


def test_bytes_is_the_byte_tokenizer_whatever_the_folder_holds(tmp_path):
    bare = bare_model(tmp_path / "bare")
    tok = load_tokenizer(str(bare), "bytes")
    assert len(tok) == 256 + len(BYTE_SPECIALS)
    assert tok("hé")["input_ids"] == list("hé".encode())  # each UTF-8 byte its own id
    assert encoder_tokenizer(str(bare), "bytes").mask_token == "[MASK]"
    with pytest.raises(UserError, match="model.tokenizer=bytes"):
        load_tokenizer(str(bare))


def test_which_folders_pass_the_check(tmp_path):
    bare = bare_model(tmp_path / "bare")
    with pytest.raises(UserError, match=r"has no tokenizer \(tokenizer.json"):
        check_tokenizer(str(bare), "auto")
    check_tokenizer(str(bare), "bytes")
    check_tokenizer(None, "auto")  # no folder: the byte tokenizer
    check_tokenizer(str(hf_model(tmp_path / "own", seed=1)), "auto")
    check_tokenizer("meta-llama/Llama-3.2-1B", "auto")  # not a folder: a hub name, left to it


def test_a_vocabulary_too_small_for_the_byte_ids():
    cfg = types.SimpleNamespace(model=types.SimpleNamespace(tokenizer="bytes", path="m/"))
    with pytest.raises(UserError, match="bytes needs 259 ids, the model at m/ has a vocab"):
        check_byte_ids(cfg, {"vocab_size": 100})
    check_byte_ids(cfg, {"vocab_size": 259})
    check_byte_ids(
        types.SimpleNamespace(model=types.SimpleNamespace(tokenizer="auto")), {"vocab_size": 9}
    )


def test_own_model_without_a_tokenizer_trains_with_bytes(tmp_path):
    """The same weights and rows as the folder with the byte tokenizer saved in it: the same
    losses, step by step."""
    bare = bare_model(tmp_path / "bare")
    saved = bare_model(tmp_path / "saved")
    from paratrain.data.text.tokenizer import byte_tokenizer

    byte_tokenizer().save_pretrained(saved)
    text = tmp_path / "notes.txt"
    text.write_text("\n\n".join(f"paragraph {i}: the weights are my own." * 3 for i in range(40)))
    common = ["--set", f"data.path={text}", "--set", "data.source=text", *QUICK]
    runs = {}
    for name, folder, more in (
        ("bytes", bare, ["--set", "model.tokenizer=bytes"]),
        ("saved", saved, []),
    ):
        out = tmp_path / name
        argv = ["run", str(LORA_RECIPE), "--set", f"model.path={folder}", *more, *common]
        assert main([*argv, "--output-dir", str(out)]) == 0
        runs[name] = losses(out)
    assert runs["bytes"] == runs["saved"] and len(runs["bytes"]) == 3
    cfg = json.loads((tmp_path / "bytes" / "plan.json").read_text())["config"]
    assert cfg["model"]["tokenizer"] == "bytes"


def test_a_folder_without_a_tokenizer_is_refused_before_the_workers(tmp_path, capsys):
    bare = bare_model(tmp_path / "bare")
    capsys.readouterr()  # transformers' bar writing the folder
    out = tmp_path / "run"
    argv = ["run", str(LORA_RECIPE), "--nproc", "2", "--set", f"model.path={bare}"]
    assert main([*argv, "--output-dir", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "--set model.tokenizer=bytes" in captured.err
    assert "torchrun" not in captured.out and not out.exists()
