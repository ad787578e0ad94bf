"""tune's space, guard and written recipe, without running trials."""

import pytest

from paratrain.config import load_config as load_raw
from paratrain.config import plain_levers
from paratrain.errors import ConfigError
from paratrain.tune import output, space
from paratrain.tune.search import Search, Trial, TuneArgs, guard_loss, trial_overrides


def load_config(recipe, overrides=None):
    """A recipe as a plan on a machine without GPUs gives it: its levers plain."""
    return plain_levers(load_raw(recipe, overrides))


def test_default_space_follows_recipe_and_machine():
    cfg = load_config("recipes/mnist_sample_mobilenetv2.yaml")
    gpu = {lv.key: lv.values for lv in space.default_space(cfg, gpus=1).levers}
    # the recipe's own value first (the baseline), GPU-only levers present
    assert gpu["data.resize_on"] == ["cpu", "gpu"]
    assert gpu["precision"] == ["fp16", "bf16"]
    assert gpu["compile"] == ["off", "default", "reduce-overhead"]
    assert gpu["model.depthwise_conv"] == ["native", "shift-add", "triton"]
    assert gpu["model.stem_conv"] == ["native", "depthwise"]  # after depthwise_conv
    assert gpu["model.batchnorm"] == ["native", "triton"]
    names = list(gpu)
    assert names.index("model.depthwise_conv") < names.index("model.stem_conv")
    assert gpu["strategy"] == ["ddp-ds", "single"]  # one GPU: DDP, or no wrapper at all
    assert gpu["ddp_lean"] == ["off", "on"]
    cpu = {lv.key: lv.values for lv in space.default_space(cfg, gpus=0).levers}
    assert "data.resize_on" not in cpu and "model.depthwise_conv" not in cpu
    assert "model.batchnorm" not in cpu  # Triton kernels: GPU levers only
    assert cpu["precision"] == ["fp16", "fp32", "bf16"]
    two = {lv.key for lv in space.default_space(cfg, gpus=2).levers}
    assert {"strategy", "ddp.gradient_compression"} <= two
    lm = load_config("recipes/tiny_llama_python_docs_cpu.yaml")
    assert "train.activation_checkpointing" in space.default_space(lm, 0).names()
    lora = load_config("recipes/llama3_8b_lora_random.yaml")
    lm_gpu = {lv.key: lv.values for lv in space.default_space(lora, gpus=1).levers}
    # the levers of the hand-found fastest LoRA set-up (compile + Liger's loss or a chunked one)
    assert lm_gpu["model.kernels"] == ["none", "liger-loss", "liger", "triton-loss"]
    assert "train.bf16_weights" not in lm_gpu  # LoRA: the base is bf16 already
    full = load_config("recipes/llama3.2_1b_full_random.yaml")
    full_gpu = {lv.key: lv.values for lv in space.default_space(full, gpus=1).levers}
    assert full_gpu["train.bf16_weights"] == [False, True]
    assert full_gpu["train.compile_scope"] == ["blocks", "decoder"]
    fsdp = load_config("recipes/llama3.2_1b_full_random.yaml", ["strategy=fsdp"])
    assert "train.compile_scope" not in space.default_space(fsdp, gpus=1).names()
    assert "train.bf16_weights" not in space.default_space(fsdp, gpus=1).names()
    ddp = load_config("recipes/llama3.2_1b_full_random.yaml", ["strategy=ddp-ds"])
    ddp_names = space.default_space(ddp, gpus=1).names()
    assert "train.bf16_weights" in ddp_names and "train.compile_scope" not in ddp_names
    assert lm_gpu["model.loss_chunk_tokens"] == [0, 1024]
    assert lm_gpu["model.fp8"][1:] == ["rowwise", "tensorwise", "delayed"]
    assert lm_gpu["train.fused_optimizer"] == [False, True]  # the guard's flag off the host
    # the fastest recipe already holds the input levers: only what differs is left
    fast = load_config("recipes/mnist_sample_mobilenetv2_fastest.yaml")
    left = space.default_space(fast, gpus=1).names()
    assert "data.resize_on" not in left


def test_tune_starts_from_the_plans_automatic_levers(monkeypatch):
    """On a GPU with Triton the plan's auto choices are each lever's baseline, first in its
    values: a trial that keeps them all is the recipe as the plan runs it."""
    import paratrain.launch.torchrun
    import paratrain.runplan as runplan
    from paratrain.protocols import Machine
    from paratrain.runplan import levers, plan_of

    monkeypatch.setattr(levers, "machine_of", lambda device: Machine("cuda", (9, 0), True, "H100"))
    monkeypatch.setattr(runplan, "device_of", lambda cfg: "cuda")
    monkeypatch.setattr(paratrain.launch.torchrun, "default_nproc", lambda several: 1)
    fast = plan_of("recipes/mnist_sample_mobilenetv2_fastest.yaml").config
    gpu = {lv.key: lv.values for lv in space.default_space(fast, gpus=1).levers}
    assert (
        gpu["compile"][0] == "reduce-overhead"
        and space.current(fast, "compile") == gpu["compile"][0]
    )
    assert gpu["model.depthwise_conv"][0] == "triton" and gpu["model.batchnorm"] == [
        "triton",
        "native",
    ]
    assert "train.fused_optimizer" not in gpu or gpu["train.fused_optimizer"][0] is True
    full = plan_of("recipes/llama3.2_1b_full_random.yaml").config
    full_gpu = {lv.key: lv.values for lv in space.default_space(full, gpus=1).levers}
    assert full_gpu["train.bf16_weights"][0] is True
    assert full_gpu["train.compile_scope"][0] == "decoder"


def test_space_file_and_keep(tmp_path):
    cfg = load_config("recipes/tiny_cpu.yaml")
    f = tmp_path / "space.yaml"
    f.write_text(
        "levers:\n  - {key: data.batch_size, values: [8, 32]}\n  - {key: compile, values: [off, default]}\n"
    )
    s = space.read_space(str(f), cfg)
    assert s.levers[0].values == [32, 8]  # the recipe's 32 first
    assert s.levers[1].overrides("default") == ["train.compile=true", "train.compile_mode=default"]
    with pytest.raises(ConfigError, match="not a lever"):
        space.keep(s, ["precision"])
    assert space.keep(s, ["compile"]).names() == ["data.batch_size"]
    f.write_text("levers:\n  - {key: compile, values: [fast]}\n")
    with pytest.raises(ConfigError, match="compile takes off"):
        space.read_space(str(f), cfg)


def test_trial_settings_and_guard():
    cfg = load_config("recipes/tiny_cpu.yaml")
    s = space.Space([space.Lever("precision", ["fp32", "bf16"])])
    o = trial_overrides(s, {"precision": "bf16"}, steps=30, warmup=5)
    assert "precision=bf16" in o and "train.max_steps=35" in o and "train.eval=false" in o
    load_config("recipes/tiny_cpu.yaml", o)  # every setting a real key
    assert guard_loss([[5, 2.0], [10, 1.0], [15, 0.5], [20, 0.3]]) == pytest.approx(0.4)
    assert guard_loss([]) is None
    search = Search("recipes/tiny_cpu.yaml", cfg, s, TuneArgs(loss_band=0.05))
    ref = Trial(1, {"precision": "fp32"}, {}, status="ok", throughput=1.0, loss=1.0)
    search.reference = ref
    ok = Trial(2, {"precision": "bf16"}, {"precision": "bf16"}, status="ok", loss=1.04)
    bad = Trial(3, {"precision": "bf16"}, {"precision": "bf16"}, status="ok", loss=1.2)
    nan = Trial(4, {"precision": "bf16"}, {"precision": "bf16"}, status="ok", loss=float("nan"))
    for t in (ok, bad, nan):
        search._guard(t)
    assert ok.status == "ok" and ok.loss_vs_reference == pytest.approx(0.04)
    assert bad.status == "numerics" and "+20.0%" in bad.note
    assert nan.status == "numerics"


def test_tuned_recipe_reads_back(tmp_path):
    cfg = load_config("recipes/mnist_sample_mobilenetv2.yaml")
    levers = space.default_space(cfg, gpus=1)
    search = Search("recipes/mnist_sample_mobilenetv2.yaml", cfg, levers, TuneArgs(out=tmp_path))
    base = {lv.key: lv.values[0] for lv in levers.levers}
    baseline = Trial(1, base, {}, status="ok", throughput=600.0)
    best = Trial(
        5,
        {**base, "compile": "reduce-overhead", "precision": "bf16"},
        {"compile": "reduce-overhead", "precision": "bf16"},
        status="ok",
        throughput=1800.0,
    )
    search.trials = [baseline, best]
    search.reference = baseline
    text = output.tuned_recipe(search, best, baseline, "samples/s")
    assert "3.00x" in text and "# tune: autocast precision; bf16 (recipe: fp16)" in text
    path = tmp_path / "tuned.yaml"
    path.write_text(text)
    tuned = load_config(path)
    assert (
        tuned.precision == "bf16"
        and tuned.train.compile
        and tuned.train.compile_mode == "reduce-overhead"
    )
    assert tuned.model.name == "mobilenet_v2" and tuned.data.image_size == 500
    ranked = output.ranked([Trial(3, {}, {}, status="numerics", throughput=5e3), best, baseline])
    assert [t.index for t in ranked] == [5, 1, 3]


def test_a_dry_run_lists_the_levers_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """issue 50: `tune --dry-run` left paratrain-results.db in the current folder."""
    from conftest import RECIPES

    from paratrain.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["tune", str(RECIPES / "tiny_cpu.yaml"), "--dry-run"]) == 0
    assert "compile: off, default" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []
