"""train.floor (issue 62 item 3): a step's matmuls and attention, the model's own shapes at the
run's batch, each timed alone; the forecast's GEMMs are the same decomposition."""

from __future__ import annotations

import pytest
import torch
from test_api import RECIPES, settings

import paratrain
from paratrain.forecast import shapes
from paratrain.forecast.analytic.step import gemms
from paratrain.meters import floor as floors
from paratrain.protocols import Attention, Matmul, linear_matmuls


def test_a_linear_is_three_gemms_and_a_frozen_one_two():
    # forward X W^T, the input's gradient dY W, the weight's gradient dY^T X
    assert linear_matmuls(16, 4, 8) == [Matmul(16, 8, 4), Matmul(16, 4, 8), Matmul(8, 4, 16)]
    assert linear_matmuls(16, 4, 8, weight_grad=False) == [Matmul(16, 8, 4), Matmul(16, 4, 8)]
    # the forecast prices the same GEMMs: an 8B layer's q (4096 -> 4096) and down (14336 ->
    # 4096) at 4,096 tokens, and at TP 2 q split by its outputs, down by its inputs
    got = gemms(shapes.shape("llama3.1-8b"), 4096, 1)
    assert got["forward"][0] == (4096, 4096, 4096) and got["forward"][-1] == (4096, 4096, 14336)
    assert got["grad_input"][-1] == (4096, 14336, 4096)
    assert got["grad_weight"][-1] == (4096, 14336, 4096)
    split = gemms(shapes.shape("llama3.1-8b"), 4096, 2)
    assert split["forward"][0] == (4096, 2048, 4096)
    assert split["forward"][-1] == (4096, 4096, 7168)


def test_each_shape_timed_once_and_counted_as_often_as_it_runs(monkeypatch):
    calls = []

    def fake(w, device, dtype):
        calls.append(w)
        return 0.001

    monkeypatch.setattr(floors, "matmul_s", fake)
    monkeypatch.setattr(floors, "attention_s", fake)
    work = [Matmul(8, 8, 8, 3), Matmul(8, 8, 8, 2), Attention(1, 2, 1, 16, 8, 4)]
    found = floors.floor(work, torch.device("cpu"), torch.float32)
    assert len(calls) == 2  # one shape of matmul, one of attention
    assert found["matmul_s"] == pytest.approx(0.005)
    assert found["attention_s"] == pytest.approx(0.004)
    assert found["floor_s"] == pytest.approx(0.009)


def test_a_real_attention_and_matmul_take_time_on_the_cpu():
    cpu = torch.device("cpu")
    assert floors.matmul_s(Matmul(64, 64, 64), cpu, torch.float32) > 0
    assert floors.attention_s(Attention(1, 4, 2, 32, 16), cpu, torch.float32) > 0


def test_a_run_prints_its_floor_beside_its_step(tmp_path, capsys):
    result = paratrain.train(
        RECIPES / "tiny_lora_cpu.yaml",
        settings(tmp_path / "f", **{"train.floor": True, "strategy": "single"}),
    )
    floor = result["summary"]["floor"]
    assert floor["matmul_s"] > 0 and floor["attention_s"] > 0
    assert floor["floor_s"] == pytest.approx(floor["matmul_s"] + floor["attention_s"])
    assert floor["step_s"] == result["summary"]["step_time_s"] and floor["dtype"] == "float32"
    assert "paratrain: floor " in capsys.readouterr().out


def test_bench_says_the_step_beside_its_floor():
    from paratrain.bench.execute import floor_words

    line = floor_words({"floor_s": 0.2, "step_s": 0.25, "above": 0.25})
    assert line == "; step 250.0 ms, floor 200.0 ms (+25% above it)"
    assert floor_words(None) == "" and floor_words({"skipped": "sharded"}) == ""
