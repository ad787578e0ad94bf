"""What every rank would print alike, printed once: transformers' "Loading weights" bar on rank 0
only, and only in a terminal (models/hf_loading.py)."""

import torch
from test_tokenizer_choice import bare_model
from transformers.utils import logging as hf_logging

from paratrain.models import hf_loading
from paratrain.models.bert import build_bert
from paratrain.models.causal_lm.build import build_causal_lm


def test_the_loading_bar_on_rank_0_only(tmp_path, monkeypatch, capfd):
    folder = bare_model(tmp_path / "model")
    capfd.readouterr()
    for rank, terminal, shown in (("1", True, False), ("0", True, True), ("0", False, False)):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setattr(hf_loading, "_terminal", lambda t=terminal: t)
        build_causal_lm(str(folder), "pretrained", None, "sdpa", torch.float32)
        assert ("Loading weights" in capfd.readouterr().err) is shown, (rank, terminal)
        assert hf_logging.is_progress_bar_enabled()  # as it was after the load


def test_the_bert_loading_bar_on_rank_0_only(tmp_path, monkeypatch, capfd):
    monkeypatch.setattr(hf_loading, "_terminal", lambda: True)  # (capfd's is none)
    folder = tmp_path / "bert"
    kw = dict(attn="sdpa", dtype=torch.float32, device="cpu")
    build_bert(path=None, init="random", shape="tiny-bert", **kw).save_pretrained(folder)
    capfd.readouterr()
    monkeypatch.setenv("RANK", "3")
    build_bert(path=str(folder), init="pretrained", shape=None, **kw)
    assert "Loading weights" not in capfd.readouterr().err
    monkeypatch.setenv("RANK", "0")
    build_bert(path=str(folder), init="pretrained", shape=None, **kw)
    assert "Loading weights" in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()
