"""The analytic plan's matmul and attention rates by shape: the table measured on a lent H100
(forecast/profiles/h100-sxm-700w.rates.json, from benchmarks/device/matmul_shapes.py) read by
forecast/analytic/rates.py, interpolated by (M, N, K), and each GEMM of a step priced at its own
shape. Pure: no GPU."""

import json
import math
import re
import statistics
from dataclasses import replace

import pytest

from paratrain.errors import UserError
from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware, rates
from paratrain.forecast.analytic.step import Cut, Training, gemms, matmul_seconds, predict

H100 = hardware.load("h100-sxm")
FLAT = replace(H100, rates_path="")  # the same profile pricing every GEMM at one rate


def test_the_shipped_h100_profiles_name_the_measured_table():
    for name in ("h100-sxm", "h100-hbm2e-500w"):
        hw = hardware.load(name)
        assert hw.rates is not None and hw.rates.path.endswith("h100-sxm-700w.rates.json")
        assert "matmul_shapes.py" in hw.sources["rates"]
    assert hardware.load("a100-sxm").rates is None  # no A100 lent: its derates price it


def test_a_measured_shape_is_its_own_rate_and_others_are_between_their_neighbours():
    table = H100.rates
    row = table.gemm["bf16"][0]
    m, n, k, tflops = 2 ** row[0], 2 ** row[1], 2 ** row[2], row[3]
    assert table.gemm_tflops(m, n, k) == pytest.approx(tflops)
    rows = [r[3] for r in table.gemm["bf16"]]
    for shape in ((3000, 5000, 7000), (20000, 1024, 4096), (100, 100, 100), (1e6, 1e5, 1e5)):
        assert min(rows) <= table.gemm_tflops(*shape) <= max(rows)


def test_leaving_each_measured_gemm_out_it_is_interpolated_closer_than_one_rate_prices_it():
    """Each measured GEMM predicted from the others (its own row left out): the median error
    is what the module's NEIGHBOURS comment says, and the tenth worst far below one rate's
    for every shape (the table's median: what the profile's single derate amounts to), whose
    thin GEMMs it prices several times too fast (bf16 p90 16% against 81% on the H100)."""
    table = H100.rates

    def p90(errors):
        return sorted(errors)[int(0.9 * len(errors))]

    for dtype, bound in (("bf16", 0.06), ("float8", 0.07)):
        rows = table.gemm[dtype]
        left_out = [
            abs(rates._idw(rows[:i] + rows[i + 1 :], r[:3])[0] / r[3] - 1)
            for i, r in enumerate(rows)
        ]
        one = statistics.median(r[3] for r in rows)
        flat = [abs(one / r[3] - 1) for r in rows]
        assert statistics.median(left_out) < bound
        assert p90(left_out) < 0.25 and p90(flat) > 3 * p90(left_out)


def test_tensor_parallelism_splits_the_layers_gemms_as_megatron_does():
    s = shapes.shape("llama3.1-8b")
    one, eight = gemms(s, 8192, 1), gemms(s, 8192, 8)
    assert one["forward"][0] == (8192, 4096, 4096)  # q: (tokens, out, in)
    assert eight["forward"][0] == (8192, 512, 4096)  # q by its outputs
    assert eight["forward"][3] == (8192, 4096, 512)  # o by its inputs
    assert eight["grad_weight"][6] == (4096, 14336 // 8, 8192)  # down's weight gradient
    flops = sum(2 * m * n * k for kind in eight.values() for m, n, k in kind)
    assert flops == 3 * 2 * 8192 * s.layer_matmul_params / 8  # the same FLOPs as 6 N T / t


def test_thin_gemms_of_a_wide_split_are_priced_slower_than_one_rate_says():
    """The 1B layer at TP 8: its k and v GEMMs are 64 features wide; the table's rate for them
    is far below the big GEMMs', so the layer's matmuls take longer than at one rate, while a
    1-GPU layer's stay near it."""
    s = shapes.shape("llama3.2-1b")
    narrow = matmul_seconds(s, H100, 8192, 8, False)
    flat = matmul_seconds(s, FLAT, 8192, 8, False)
    assert sum(narrow.values()) > 1.15 * sum(flat.values())
    whole = matmul_seconds(s, H100, 8192, 1, False)
    flat_whole = matmul_seconds(s, FLAT, 8192, 1, False)
    assert 0.85 < sum(whole.values()) / sum(flat_whole.values()) < 1.15
    cut, train = Cut(8, tp=8), Training(8192, 2, "selective", compile=True, attention="flash")
    assert predict(s, H100, cut, train)["tps_per_gpu"] < predict(s, FLAT, cut, train)["tps_per_gpu"]


def test_attention_by_head_dim_and_sequence():
    table = H100.rates
    fwd_short, _ = table.attention_tflops(128, 32, 2048)
    fwd_long, bwd_long = table.attention_tflops(128, 32, 8192)
    assert fwd_long > fwd_short  # longer sequences keep the tiles busier
    assert table.attention_tflops(64, 32, 8192)[0] < fwd_long  # head dim 64 is slower
    cudnn = table.attention_tflops(128, 32, 8192, "cudnn")
    assert cudnn[0] > fwd_long  # the table holds both kernels
    f, b = H100.attention_s(128, 32, 8192, 8192, "flash")
    flops = 2 * 8192 * 8192 * 32 * 128
    assert f == pytest.approx(flops / (fwd_long * 1e12))
    assert b == pytest.approx(2.5 * flops / (bwd_long * 1e12))
    # the profile's own kernel: cuDNN's, what torch 2.11's sdpa picks on an H100
    assert H100.attention_s(128, 32, 8192, 8192) == pytest.approx(
        (flops / (cudnn[0] * 1e12), 2.5 * flops / (cudnn[1] * 1e12))
    )


def test_a_500w_profile_runs_the_table_at_its_clock():
    slow = hardware.load("h100-hbm2e-500w")
    assert slow.clock < 1
    assert slow.gemm_s(8192, 4096, 4096) == pytest.approx(
        H100.gemm_s(8192, 4096, 4096) / slow.clock
    )


def test_a_bad_table_is_one_line(tmp_path):
    profile = (hardware.PROFILES / "h100-sxm.toml").read_text()
    for body, says in (
        ("{", "is not JSON"),
        (json.dumps({"gemm": {"bf16": [[1, 2]]}}), "is malformed"),
    ):
        (tmp_path / "t.json").write_text(body)
        path = tmp_path / "p.toml"
        path.write_text(profile.replace('rates = "h100-sxm-700w.rates.json"', 'rates = "t.json"'))
        rates.load.cache_clear()
        with pytest.raises(UserError, match=says):
            hardware.load(str(path)).gemm_s(1, 1, 1)
    path.write_text(re.sub(r"^attention_backend = .*$", 'kernel = "x"', profile, flags=re.M))
    with pytest.raises(UserError, match=r"\[tables\] holds rates and attention_backend"):
        hardware.load(str(path))
    assert math.isfinite(H100.gemm_s(8192, 8192, 8192))


def test_attention_with_shared_kv_heads_is_its_own_rows_and_a_table_without_them_says_so(tmp_path):
    """paratrain's decoder shares k/v heads through sdpa's enable_gqa: the `_gqa` rows (a lent
    H100, benchmarks/results/2026-12-07-h100x1/attention_gqa/) price it; a table without them is
    one line, not a guess from the expanded rows."""
    table = H100.rates
    for backend in ("flash", "cudnn"):
        shared = table.attention_tflops(64, 32, 2048, f"{backend}_gqa")
        assert shared != table.attention_tflops(64, 32, 2048, backend)
        assert all(100 < r < 1000 for r in shared)
    s = shapes.shape("llama3.2-1b")
    train = Training(seq_len=2048, local_batch=8, attention="cudnn_gqa")
    assert predict(s, H100, Cut(gpus=1), train)["tps_per_gpu"] > 0
    with pytest.raises(UserError, match="attention: 'xformers'"):
        predict(s, H100, Cut(gpus=1), replace(train, attention="xformers"))
    old = json.loads((hardware.PROFILES / "h100-sxm-700w.rates.json").read_text())
    old["attention"] = {k: v for k, v in old["attention"].items() if not k.endswith("_gqa")}
    (tmp_path / "t.json").write_text(json.dumps(old))
    path = tmp_path / "p.toml"
    profile = (hardware.PROFILES / "h100-sxm.toml").read_text()
    path.write_text(profile.replace('rates = "h100-sxm-700w.rates.json"', 'rates = "t.json"'))
    rates.load.cache_clear()
    with pytest.raises(UserError, match="no cudnn_gqa attention measured"):
        predict(s, hardware.load(str(path)), Cut(gpus=1), train)
