"""The loop in one process: accumulation, activation checkpointing, models."""

import pytest
import torch
from conftest import TINY_SETTINGS, final_weights, train

from paratrain.config import load_config
from paratrain.models import build_model
from paratrain.models.vision import build_mobilenet_v2, build_resnet50, trunk_blocks
from paratrain.parallel.ac import apply_activation_checkpointing

BASE = [*TINY_SETTINGS, "data.limit_samples=512"]


def run(tmp_path, name, extra):
    cfg = load_config(None, BASE + [f"output_dir={tmp_path / name}"] + extra)
    train(cfg)
    return final_weights(tmp_path / name)


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def test_gradient_accumulation_equals_larger_batch(tmp_path):
    big = run(tmp_path, "big", ["data.batch_size=32", "train.max_steps=6"])
    acc = run(
        tmp_path, "acc", ["data.batch_size=8", "train.grad_accum_steps=4", "train.max_steps=6"]
    )
    assert max_diff(big, acc) < 1e-5  # fp32 summation order differs; nothing else


def test_accumulation_is_not_a_no_op(tmp_path):
    """The comparison above can fail: a different batch gives different weights."""
    big = run(tmp_path, "big", ["data.batch_size=32", "train.max_steps=6"])
    small = run(tmp_path, "small", ["data.batch_size=8", "train.max_steps=6"])
    assert max_diff(big, small) > 1e-3


def test_activation_checkpointing_keeps_gradients_and_names():
    torch.manual_seed(0)
    a = build_model(load_config(None, ["model.name=tiny_cnn"]).model, 10, 1)
    b = build_model(load_config(None, ["model.name=tiny_cnn"]).model, 10, 1)
    b.load_state_dict(a.state_dict())
    apply_activation_checkpointing(trunk_blocks(b))
    assert a.state_dict().keys() == b.state_dict().keys()
    x = torch.randn(4, 1, 28, 28)
    a(x).sum().backward()
    b(x).sum().backward()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_activation_checkpointing_recomputes():
    model = build_mobilenet_v2(10, 1)
    apply_activation_checkpointing(trunk_blocks(model))
    calls = []
    inner = model.features[3].conv[0]  # the first layer inside a checkpointed block
    inner.register_forward_hook(lambda *a: calls.append(1))
    model(torch.randn(2, 1, 32, 32)).sum().backward()
    assert len(calls) == 2  # forward, then again in backward


@pytest.mark.parametrize("builder", [build_mobilenet_v2, build_resnet50])
def test_torchvision_models_take_one_channel(builder):
    model = builder(10, 1).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 1, 64, 64)).shape == (2, 10)
    apply_activation_checkpointing(trunk_blocks(model))  # both have a sequential trunk


def test_user_model_builder(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(
        "import torch\n"
        "def build(num_classes, in_channels):\n"
        "    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(in_channels*28*28, num_classes))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(
        None,
        [x for x in BASE if not x.startswith("model.")]
        + [
            "model.name=my_models:build",
            "train.max_steps=3",
            f"output_dir={tmp_path / 'u'}",
            "train.eval=true",
        ],
    )
    result = train(cfg)
    assert (
        result["summary"]["optimizer_steps"] == 3 and result["summary"]["val_accuracy"] is not None
    )


def test_fp64_trains_in_double(tmp_path):
    weights = run(tmp_path, "f64", ["precision=fp64", "train.max_steps=2"])
    assert all(v.dtype == torch.float64 for v in weights.values())


def test_result_has_the_metrics(tmp_path):
    cfg = load_config(
        None,
        BASE
        + [
            "train.max_steps=12",
            "train.epochs=2",
            "train.warmup_steps=2",
            "train.eval=true",
            f"output_dir={tmp_path / 'm'}",
        ],
    )
    result = train(cfg)
    s = result["summary"]
    assert s["optimizer_steps"] == 12 and s["measured_steps"] == 10 and s["warmup_excluded"]
    assert s["unique_samples_per_s"] > 0 and s["step_time_s"] > 0 and s["peak_memory_bytes"] > 0
    assert 0 <= s["val_accuracy"] <= 1 and s["train_loss"] > 0
    epochs = result["epochs"]
    assert [e["steps"] for e in epochs] == [8, 4] and all(
        e["wall_s"] >= e["train_s"] > 0 for e in epochs
    )
    best = max(epochs, key=lambda e: e["val_accuracy"])
    assert (s["best_val_accuracy"], s["best_epoch"]) == (best["val_accuracy"], best["epoch"])
    assert (tmp_path / "m" / "result.json").is_file() and (tmp_path / "m" / "config.yaml").is_file()


def test_max_steps_runs_past_epochs(tmp_path):
    cfg = load_config(
        None, BASE + ["train.max_steps=20", "train.epochs=1", f"output_dir={tmp_path / 'x'}"]
    )
    result = train(cfg)  # 512 samples / 64 = 8 steps an epoch: 20 steps take 3 epochs
    assert result["summary"]["optimizer_steps"] == 20 and len(result["epochs"]) == 3


def test_profiled_steps_come_after_warm_up_and_before_the_measurement(tmp_path):
    out = tmp_path / "prof"
    cfg = load_config(
        None,
        BASE
        + [
            f"output_dir={out}",
            "train.max_steps=9",
            "train.warmup_steps=2",
            "train.profile_steps=3",
            "train.eval=false",
        ],
    )
    s = train(cfg)["summary"]
    assert s["measured_steps"] == 4  # 9 - 2 warm-up - 3 profiled
    table = (out / "profile.txt").read_text()
    assert "over 3 steps after warm-up" in table and "aten::" in table
    assert "wall time per step" in table and (out / "trace.json.gz").stat().st_size > 0
    top = s["profile"]
    assert top and all(t["ms_per_step"] >= 0 and 0 <= t["share"] <= 1 for t in top)
    assert any("conv" in t["name"] or "addmm" in t["name"] for t in top)  # the model's work
    # the step by phase: each phase's span, and what no phase covers, add up to the wall time
    phases = s["profile_phases"]
    assert list(phases["phases"]) == ["data", "forward", "backward", "checks", "optimizer"]
    spans = [v["cpu_ms"] for v in phases["phases"].values()]
    assert all(ms > 0 for ms in spans) and phases["phases"]["backward"]["cpu_ms"] > 0
    assert sum(spans) + phases["other_ms"] == pytest.approx(phases["wall_ms"], rel=1e-6)
    assert "phases of the step" in table and (out / "phases.png").read_bytes()[:4] == b"\x89PNG"
    plain = train(
        load_config(None, BASE + [f"output_dir={tmp_path / 'plain'}", "train.max_steps=3"])
    )
    assert plain["summary"]["profile"] is None and not (tmp_path / "plain" / "profile.txt").exists()
    assert plain["summary"]["profile_phases"] is None


def test_compile_options_reach_torch_compile(tmp_path, monkeypatch):
    seen = []

    def fake_compile(model, **kwargs):  # records the call, trains the eager model
        seen.append(kwargs)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    extra = [
        "train.compile=true",
        "train.compile_mode=reduce-overhead",
        "train.compile_options.coordinate_descent_tuning=true",
        "train.max_steps=2",
    ]
    run(tmp_path, "c", extra)
    options = {"triton.cudagraphs": True, "coordinate_descent_tuning": True}
    assert seen == [{"options": options}]


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_fused_optimizer_makes_the_same_update(tmp_path, optimizer):
    common = [f"train.optimizer={optimizer}", "train.max_steps=4"]
    default = run(tmp_path, "default", common)
    fused = run(tmp_path, "fused", [*common, "train.fused_optimizer=true"])
    assert max_diff(default, fused) < 1e-5


def test_ddp_settings_reach_the_wrapper_and_dynamo(tmp_path):
    import torch.distributed as dist
    from torch import nn

    from paratrain.parallel.ddp import apply_ddp

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        cfg = load_config(
            None,
            ["ddp.split_compiled_graph=false", "ddp.static_graph=true", "ddp.broadcast_buffers=no"],
        )
        wrapped = apply_ddp(nn.BatchNorm1d(4), torch.device("cpu"), cfg.ddp)
        assert torch._dynamo.config.optimize_ddp is False and wrapped.static_graph
        assert not wrapped.will_sync_module_buffers()  # no per-forward buffer sync
        default = apply_ddp(nn.BatchNorm1d(4), torch.device("cpu"), load_config(None).ddp)
        assert torch._dynamo.config.optimize_ddp is True and default.will_sync_module_buffers()
    finally:
        dist.destroy_process_group()
        torch._dynamo.config.optimize_ddp = True


def test_gc_every_steps_collects_on_schedule_and_changes_nothing(tmp_path, monkeypatch):
    import gc

    from paratrain.trainer import measure as train_mod

    default = run(tmp_path, "default", ["train.max_steps=6"])
    collected, enabled = [], []
    real_collect = gc.collect

    def spy(generation=2):
        collected.append(generation)
        enabled.append(gc.isenabled())
        return real_collect(generation)

    monkeypatch.setattr(train_mod.gc, "collect", spy)
    scheduled = run(tmp_path, "scheduled", ["train.max_steps=6", "train.gc_every_steps=2"])
    assert max_diff(default, scheduled) == 0.0
    # once before the loop (full), then after steps 2, 4 and 6 (young generations), with
    # automatic collection off throughout; back on after the run
    assert collected[0] == 2 and collected[1:].count(1) == 3
    assert enabled[0] and not any(enabled[1:])
    assert gc.isenabled()


def test_gc_schedule_turns_collection_back_on_after_an_error():
    import gc

    from paratrain.trainer.measure import gc_pause, gc_schedule

    with pytest.raises(RuntimeError), gc_schedule(5):
        gc_pause(5)
        assert not gc.isenabled()
        raise RuntimeError("boom")
    assert gc.isenabled()
    with gc_schedule(0):  # 0: Python's own schedule, untouched
        gc_pause(0)
        assert gc.isenabled()


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_clip_in_the_fused_kernel_equals_clip_then_step(tmp_path, optimizer):
    """train.max_grad_norm with a fused optimizer: the kernel divides the gradients (its
    grad_scale) instead of a pass of clip_grads_with_norm_; the same weights either way, and
    not those of the unclipped run (the check can fail). The norm is small enough that it
    matters to AdamW too (gradients near its eps)."""
    clip = "train.max_grad_norm=" + ("0.05" if optimizer == "sgd" else "1e-7")
    common = ["data.batch_size=16", "train.max_steps=4", f"train.optimizer={optimizer}"]
    in_kernel = run(tmp_path, "fused", [*common, clip, "train.fused_optimizer=true"])
    separate = run(tmp_path, "separate", [*common, clip, "train.fused_optimizer=false"])
    free = run(tmp_path, "free", [*common, "train.fused_optimizer=true"])
    assert max_diff(in_kernel, separate) < 1e-5
    assert max_diff(in_kernel, free) > 1e-3
