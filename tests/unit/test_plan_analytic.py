"""The analytic plan against hand-computed cases: each number is worked out in the
comment beside it, so a changed formula fails here. Pure: no GPU, no model allocated."""

from dataclasses import replace

import pytest

from paratrain.cli import main
from paratrain.errors import UserError
from paratrain.forecast import shapes
from paratrain.forecast.analytic import hardware, search
from paratrain.forecast.analytic import step as analytic
from paratrain.forecast.analytic.step import Cut, Training, predict
from paratrain.forecast.calibrated.model import bubble, collective_s

# the hand cases price every matmul at the profile's one derated rate (its measured table by
# shape is tests/unit/test_plan_rates.py's)
H100 = replace(hardware.load("h100-sxm"), rates_path="")
B8, B70, B405 = (shapes.shape(f"llama3.1-{s}") for s in ("8b", "70b", "405b"))


def test_llama31_parameter_counts():
    # the published counts of meta-llama's 3.1 checkpoints
    assert B8.params == 8_030_261_248
    assert B70.params == 70_553_706_496
    assert B405.params == 405_853_388_800
    # 8B's layer: q, o 4096^2; k, v 4096 x 1024; gate, up, down 4096 x 14336
    assert B8.layer_matmul_params == 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert shapes.shape("llama3.2-1b").tied  # a SHAPES entry, read as config fields


def test_bubble_hand_cases():
    # 1F1B, p = 8 stages, m = 8 micro-batches: 7 / (8 + 7) of the step idle
    assert bubble(8, 8) == pytest.approx(7 / 15)
    # interleaved, 2 stages a rank: the fill and drain are 7 chunks of 1/2 a rank's layers
    assert bubble(8, 8, per_rank=2) == pytest.approx(7 / 23)


def test_pipeline_idle_time_in_the_step():
    # the step's idle time is work x b / (1 - b): 1F1B at p = m = 8 idles 7/8 of the work
    train = Training(8192, 32, "full", compile=True, float8=True)
    one = predict(B405, H100, Cut(512, tp=8, pp=8, async_tp=True), train)
    busy = one["step_s"] - one["terms"]["pp_bubble_s"]
    work = busy - sum(
        one["terms"][k]
        for k in ("pp_p2p_s", "optimizer_s", "fsdp_exposed_s", "fsdp_copies_s", "collective_sms_s")
    )
    assert one["terms"]["pp_bubble_s"] == pytest.approx(work * 7 / 8)
    two = predict(
        B405,
        H100,
        Cut(512, tp=8, pp=8, async_tp=True, schedule="interleaved", stages_per_rank=2),
        train,
    )
    # 126 layers in 8 or 16 stages: the busiest rank holds 16 either way, so the same work and
    # an idle time of 7/16 of it instead of 7/8
    assert two["terms"]["pp_bubble_s"] == pytest.approx(work * 7 / 16)


def test_all_gather_hand_case():
    # one 8B layer's bf16 weights (218,103,808 matmul + 8,192 norm parameters) all-gathered
    # over 8 GPUs on NVLink at 450 x 0.8 = 360 GB/s: 7/8 x 436,224,000 bytes / 360e9 s
    gathered = (B8.layer_matmul_params + 2 * 4096) * 2
    assert gathered == 436_224_000
    assert collective_s(gathered, 8, H100.bus_gbps(False)) == pytest.approx(
        7 / 8 * 436_224_000 / 360e9
    )
    # across nodes a NIC's 50 x 0.94 = 47 GB/s (nccl-tests#290's 46-48): one GPU a node
    # (FSDP under TP 8) drives one NIC; all 8 of a node drive 8, capped at NVLink's 360
    assert collective_s(gathered, 128, H100.bus_gbps(True)) == pytest.approx(
        127 / 128 * 436_224_000 / 47e9
    )
    assert H100.bus_gbps(True, per_node=8) == 360.0
    assert H100.bus_gbps(True, per_node=4) == 4 * 47.0
    # the profile's collective adds its fixed time: 20 us within a node, 58 us across
    assert H100.collective_s(gathered, 8, per_node=8) == pytest.approx(
        7 / 8 * 436_224_000 / 360e9 + 20e-6
    )
    assert H100.collective_s(gathered, 32, per_node=1) == pytest.approx(
        31 / 32 * 436_224_000 / 47e9 + 58e-6
    )
    assert H100.collective_s(gathered, 1, per_node=1) == 0.0
    # an all-reduce moves twice the shard's share
    assert collective_s(1e9, 4, 100, "all_reduce") == pytest.approx(2 * 3 / 4 * 1e9 / 100e9)


def test_fsdp_exposes_the_unhidden_collectives():
    # FSDP 8 on one node, the 8B at batch 2 x 8192: each layer's compute (~60 ms) outlasts its
    # all-gather (~1 ms), so what is exposed is the first all-gather and the last
    # reduce-scatter of a layer and the root's (embedding + lm_head: 1,050,677,248 parameters)
    train = Training(8192, 2, "selective", compile=True)
    layer = analytic.layer_terms(B8, H100, train, 2 * 8192, 1)
    t = analytic.fsdp_terms(B8, H100, Cut(8), train, 32, layer)
    bus, fixed = 360e9, 20e-6  # each collective's fixed time within a node (the profile's)
    ag = 7 / 8 * 436_224_000 / bus + fixed
    rs = 7 / 8 * (B8.layer_params * 4) / bus + fixed
    root = 525_336_576 * 2 + 4096
    root_ag, root_rs = 7 / 8 * root * 2 / bus + fixed, 7 / 8 * root * 4 / bus + fixed
    assert t["fsdp_exposed_s"] == pytest.approx(ag + rs + root_ag + root_rs)
    assert t["fsdp_comm_s"] == pytest.approx(32 * (2 * ag + rs) + root_ag + root_rs)


def test_hidden_collectives_take_their_sms_from_compute():
    # NCCL's 16 channels hold 16 of the H100's 132 SMs while a collective runs, so the compute
    # it hides under runs 16/132 slower for that time: FSDP 8 on the 8B, whose collectives all
    # overlap compute but the exposed ones
    train = Training(8192, 2, "selective", compile=True)
    one = predict(B8, H100, Cut(8), train)
    assert (H100.channels, H100.sms) == (16, 132)
    hidden = one["fsdp_comm_s"] - one["terms"]["fsdp_exposed_s"]
    assert one["terms"]["collective_sms_s"] == pytest.approx(hidden * 16 / 132)
    without = predict(B8, replace(H100, channels=0), Cut(8), train)
    assert one["step_s"] - without["step_s"] == pytest.approx(hidden * 16 / 132)
    # async TP hides its forward all-gathers with the copy engines: FSDP's share alone counts
    tp = predict(B70, H100, Cut(256, tp=8, async_tp=True), Training(8192, 16, "full", True, True))
    assert tp["tp_comm_s"] - tp["terms"]["tp_exposed_s"] > 0
    fsdp_hidden = tp["fsdp_comm_s"] - tp["terms"]["fsdp_exposed_s"]
    assert tp["terms"]["collective_sms_s"] == pytest.approx(fsdp_hidden * 16 / 132)
    # one GPU: no collective, nothing taken
    assert predict(B8, H100, Cut(1), Training(2048, 2))["terms"]["collective_sms_s"] == 0


def test_lora_adapters_priced_at_the_memory_rate():
    # r = 8 on q (4096 -> 4096), v (4096 -> 1024), o (4096 -> 4096) of the 8B at 4,096 tokens:
    # of each adapter's six GEMMs three read or write a [T, in] tensor, three a [T, out] one,
    # each with its r-wide side and its small weight: all memory-bound on an H100
    t, r = 4096, 8

    def side(width):  # three GEMMs, each [T, width] + [T, r] + [width, r] in bf16
        return 3 * 2 * (t * width + t * r + width * r)

    moved = sum(side(i) + side(o) for i, o in ((4096, 4096), (4096, 1024), (4096, 4096)))
    assert analytic.adapter_seconds(B8, H100, t, 1) == pytest.approx(moved / (3.35e12 * 0.91))
    # in the LoRA step, on top of the frozen layer's forward and input-gradient GEMMs
    lora = analytic.layer_terms(B8, H100, Training(2048, 2, "none", True, lora=True), t, 1)
    mm = analytic.matmul_seconds(B8, H100, t, 1, False)
    assert lora["matmul_s"] == pytest.approx(
        mm["forward"] + mm["grad_input"] + analytic.adapter_seconds(B8, H100, t, 1)
    )


def test_ddp_and_hsdp_all_reduce_hand_cases():
    # DDP over 8 on one node (HSDP with shards of 1): every fp32 gradient ring-all-reduced,
    # 2 x 7/8 x 4 bytes a parameter at 360 GB/s
    one_b = shapes.shape("llama3.2-1b")
    train = Training(2048, 8, "none", compile=True)
    ddp = predict(one_b, H100, Cut(8, dp_replicate=8), train)
    assert ddp["layout"] == "DDP 8"
    # (16 layers' all-reduces and the root's, each with the profile's 20 us within a node)
    ddp_s = 2 * 7 / 8 * 4 * one_b.params / 360e9 + 17 * 20e-6
    assert ddp["fsdp_comm_s"] == pytest.approx(ddp_s)
    # HSDP 2 x 8: FSDP within each node, and each GPU's 1/8 shard all-reduced across the two
    # nodes over its own NIC at 47 GB/s (one GPU of each pair a node), 58 us fixed each:
    # 2 x 1/2 x 4 bytes x params / 8 on top of FSDP 8's volume
    fsdp = predict(one_b, H100, Cut(8), train)
    hsdp = predict(one_b, H100, Cut(16, dp_replicate=2), train)
    across = 2 * 1 / 2 * 4 * one_b.params / 8 / 47e9 + 17 * 58e-6
    assert hsdp["fsdp_comm_s"] == pytest.approx(fsdp["fsdp_comm_s"] + across)


def test_recompute_hand_cases():
    # selective (op policy): the 2nd, 4th and 6th of q, k, v, o, gate, up, down run again:
    # k (4096 x 1024), o (4096^2), up (4096 x 14336) of 218,103,808
    share = (4096 * 1024 + 4096**2 + 4096 * 14336) / 218_103_808
    assert analytic.recompute_share(B8, "selective") == pytest.approx(share)
    assert share == pytest.approx(0.3654, abs=1e-4)
    assert analytic.recompute_share(B8, "full") == 1
    assert analytic.recompute_share(B8, "none") == 0
    # full AC on one 8,192-token micro-batch: the forward's matmuls (2 x T x P) and its
    # attention (2 x T x s x h, causal) once more, at the profile's rates
    train = Training(8192, 1, "full", compile=True)
    t = analytic.layer_terms(B8, H100, train, 8192, 1)
    mm = 2 * 8192 * 218_103_808 / (989.4e12 * 0.695)
    att = 2 * 8192 * 8192 * 4096 / (989.4e12 * 0.299)
    assert t["recompute_s"] == pytest.approx(mm + att)
    parts = ("matmul_s", "recompute_s", "attention_s", "memory_bound_s", "float8_casts_s")
    assert sum(t[k] for k in parts) == pytest.approx(t["total_s"])


def test_memory_state_sharded():
    # FSDP 8: fp32 weights + fp32 gradients + two fp32 moments = 16 bytes a parameter / 8
    m = analytic.memory_terms(B8, H100, Cut(8), Training(8192, 2, "selective"))
    assert m["state_bytes"] == pytest.approx(B8.params * 16 / 8)
    # full AC keeps one bf16 hidden vector a token and layer: 32 x 16,384 x 4,096 x 2 bytes
    full = analytic.memory_terms(B8, H100, Cut(8), Training(8192, 2, "full"))
    assert full["activation_bytes"] == pytest.approx(32 * 16384 * 4096 * 2)


def test_pipeline_memory_by_schedule():
    # 405B, PP 8, 16 micro-batches of 2 sequences, full AC (one bf16 hidden vector a token and
    # layer, sequence-sharded over TP 8): the first rank's 16 layers hold 16 micro-batches under
    # GPipe, 8 (= p) under 1F1B
    train = Training(8192, 32, "full", compile=True, float8=True)
    per_mb_layer = 2 * 8192 * 16384 * 2 / 8
    for schedule, flight in (("gpipe", 16), ("1f1b", 8)):
        layout = Cut(512, tp=8, pp=8, schedule=schedule, microbatches=16)
        m = analytic.memory_terms(B405, H100, layout, train)
        assert m["rank"] == 0
        # 16 layers' saved inputs a micro-batch in flight, and the stage's output kept until
        # its backward: under full AC as big as one layer's input
        assert m["activation_bytes"] == pytest.approx((16 + 1) * flight * per_mb_layer)
    # interleaved, 2 stages a rank: the first rank's 23 chunk-micro-batches of 8 layers in
    # flight (torch's warm-up (v-1)p + 2(p-1) forwards, and one more), each with its output
    layout = Cut(512, tp=8, pp=8, schedule="interleaved", stages_per_rank=2, microbatches=16)
    m = analytic.memory_terms(B405, H100, layout, train)
    assert m["rank"] == 0
    assert m["activation_bytes"] == pytest.approx((16 * 23 / 2 + 23) * per_mb_layer)
    assert analytic.rank_layers(B405, Cut(512, tp=8, pp=8)) == [16] * 6 + [15, 15]


def test_hardware_profiles():
    for name in hardware.names():
        hw = hardware.load(name)
        assert hw.bf16_tflops > 0 and hw.sources["matmul"]
    slow = hardware.load("h100-hbm2e-500w")
    # the measured power curve: (500 - 121) / (700 - 121) of the dynamic power at n = 2.32
    assert slow.clock == pytest.approx(((500 - 121) / (700 - 121)) ** (1 / 2.32))  # 0.833
    assert slow.clock < (500 / 700) ** (1 / 3)  # the textbook cube root, 0.894
    # without a measured curve: the cube root of the power
    sheet = {k: 1 for k in hardware._NUMBERS} | {"power_w": 500, "rated_power_w": 700}
    rule = hardware.from_dict({"datasheet": sheet, "derate": {k: 0.5 for k in hardware._DERATES}})
    assert rule.clock == pytest.approx((500 / 700) ** (1 / 3))
    derate = {k: 0.5 for k in hardware._DERATES}
    for power, message in (
        ({"static_w": 600}, r"power.static_w must lie in \[0, 500\)"),
        ({"exponent": float("nan")}, "power.exponent must be a number above 0"),
        ({"exponnent": 2}, r"\[power\] holds static_w and exponent only"),
    ):
        with pytest.raises(UserError, match=message):
            hardware.from_dict({"datasheet": sheet, "derate": derate, "power": power})
    with pytest.raises(UserError, match="datasheet.power_w must be a number, got 'abc'"):
        hardware.from_dict({"datasheet": sheet | {"power_w": "abc"}, "derate": derate})
    with pytest.raises(UserError, match="datasheet.power_w must be above 0"):
        hardware.from_dict({"datasheet": sheet | {"power_w": 0}, "derate": derate})
    assert H100.clock == 1
    with pytest.raises(UserError, match="no profile"):
        hardware.load("h900")
    with pytest.raises(UserError, match=r"derate.matmul must lie in \(0, 1\]"):
        hardware.from_dict(
            {
                "datasheet": {k: 1 for k in hardware._NUMBERS},
                "derate": {k: (1.5 if k == "matmul" else 0.5) for k in hardware._DERATES},
            }
        )
    with pytest.raises(UserError, match="float8"):
        hardware.load("a100-sxm").matmul_flops(float8=True)
    # [collectives] channels: whole, below the SMs; absent, no SMs taken
    assert rule.collective_sm_share == 0
    for table, message in (
        ({"channels": 16.5, "sms": 132}, "collectives.channels must be a whole number"),
        ({"channels": 132, "sms": 132}, "collectives.channels must be below sms"),
        ({"channels": 16}, "collectives.channels must be below sms"),
        ({"ctas": 16}, r"\[collectives\] holds latency_intra_us"),
    ):
        with pytest.raises(UserError, match=message):
            hardware.from_dict({"datasheet": sheet, "derate": derate, "collectives": table})


def test_layouts_refused_in_one_line():
    with pytest.raises(UserError, match="TP 3"):
        predict(B8, H100, Cut(6, tp=3), Training())
    with pytest.raises(UserError, match="micro-batches"):
        predict(B405, H100, Cut(512, tp=8, pp=8), Training(8192, 4, "full"))


def test_best_layout_search():
    b = search.best(B8, H100, 8)
    assert b["layout"] == "FSDP 8" and b["memory_gib"] <= H100.memory_gib
    with pytest.raises(UserError, match="state alone"):
        search.best(B405, H100, 8)


def test_cli_validate_and_layouts(capsys):
    assert main(["plan", "--validate", "torchtitan-h100"]) == 0
    out = capsys.readouterr().out
    assert "| torchtitan_2024_12: 5 | llama3.1-405b, 512 |" in out and "median TPS/GPU error" in out
    assert main(["plan", "--hardware", "h100-sxm", "--shape", "llama3.1-70b", "--gpus", "512"]) == 0
    out = capsys.readouterr().out
    assert "| 512 |" in out and "to price it again" in out
    assert "at 500 W" not in out and out.rstrip().endswith("h100-sxm.toml")
    assert (
        main(["plan", "--hardware", "h100-hbm2e-500w", "--shape", "llama3.1-8b", "--gpus", "8"])
        == 0
    )
    out = capsys.readouterr().out
    assert "at 500 W of 700: the compute rates x 0.833" in out
    assert main(["plan", "--validate", "nope"]) == 2
    assert "--validate: unknown" in capsys.readouterr().err
    # one line each, exit 2: no shape, not a Llama shape, a recipe's flag, a flag without its mode
    for args, says in (
        (["--hardware", "h100-sxm"], "give --shape"),
        (["--hardware", "h100-sxm", "--shape", "gpt2"], "no shape 'gpt2'"),
        (["--validate", "torchtitan-h100", "--measure", "1"], "--measure needs a recipe"),
        (["--validate", "torchtitan-h100", "--shape", "llama3.1-8b"], "the table's own"),
        (["recipes/tiny_cpu.yaml", "--float8"], "--float8 goes with --hardware"),
        ([], "give a recipe"),
    ):
        assert main(["plan", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("error") == 1 and says in err, err


def test_in_flight_is_what_torchs_schedules_held():
    """Micro-batches of a stage's layers each rank held at its peak under torch's own
    schedules, p = 4, measured on CPU processes (benchmarks/results/2026-12-06-cpu/pp_memory:
    block-micro-batches over the 2 blocks a rank)."""
    measured = {  # (schedule, m) -> units held by ranks 0..3
        ("gpipe", 4): [8, 8, 8, 8],
        ("1f1b", 4): [8, 6, 4, 2],
        ("interleaved", 4): [8, 8, 7, 5],
        ("gpipe", 8): [16, 16, 16, 16],
        ("1f1b", 8): [8, 6, 4, 2],
        ("interleaved", 8): [11, 9, 7, 5],
    }
    for (schedule, m), units in measured.items():
        layout = Cut(4, pp=4, schedule=schedule, stages_per_rank=2, microbatches=m)
        assert [2 * analytic.in_flight(layout, r) for r in range(4)] == units, (schedule, m)
