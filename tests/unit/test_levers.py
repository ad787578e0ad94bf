"""The plan's automatic levers (runplan/levers.py, Task.levers): what `auto` comes to on a GPU
with Triton, without Triton, on the CPU, under `levers: plain`, and that a set value wins. The
machine is given (protocols.Machine): these are the decisions, not the GPU's arithmetic (the
GPU tests and benchmarks/results/2026-12-06-h100x1/issue53/ run them)."""

import pytest
from conftest import RECIPES

import paratrain.launch.torchrun
import paratrain.runplan as runplan
from paratrain.errors import ConfigError
from paratrain.protocols import Machine
from paratrain.runplan import levers, plan_of, show

H100 = Machine("cuda", (9, 0), True, "NVIDIA H100 80GB HBM3")
NO_TRITON = Machine("cuda", (9, 0), False, "NVIDIA H100 80GB HBM3")
V100 = Machine("cuda", (7, 0), True, "Tesla V100")


@pytest.fixture
def on(monkeypatch):
    """plan_of as on a machine with one GPU like `machine`."""

    def plan(machine, recipe, overrides=()):
        monkeypatch.setattr(levers, "machine_of", lambda device: machine)
        monkeypatch.setattr(runplan, "device_of", lambda cfg: machine.device)
        monkeypatch.setattr(paratrain.launch.torchrun, "default_nproc", lambda several: 1)
        return plan_of(recipe, list(overrides))

    return plan


def chosen(plan) -> dict:
    return {c.key: c.value for c in plan.levers}


def test_the_1b_recipe_on_a_gpu_gets_full_trainings_measured_levers(on):
    plan = on(H100, RECIPES / "llama3.2_1b_full_random.yaml")
    got = chosen(plan)
    assert got["train.compile"] is True and got["train.compile_scope"] == "decoder"
    assert got["train.bf16_weights"] is True and got["model.kernels"] == "triton-loss"
    assert got["train.compile_mode"] == "default"  # CUDA graphs did not pay here (issue 34)
    assert got["train.fused_optimizer"] is False  # MasterAdamW's own kernel
    cfg = plan.config  # the config as it runs holds the decisions: what config.yaml keeps
    assert cfg.train.bf16_weights is True and cfg.model.kernels == "triton-loss"
    lines = "\n".join(show.lines(plan))
    assert "lever      train.bf16_weights=true: " in lines and "benchmarks/results/" in lines
    assert "hint       model.fp8=delayed" in lines  # faster, other numerics: named, not taken
    # float8 is the one opt-in flag; lm_head follows it, the bf16 levers step aside
    fp8 = chosen(on(H100, RECIPES / "llama3.2_1b_full_random.yaml", ["model.fp8=delayed"]))
    assert fp8["model.fp8_lm_head"] is True and fp8["train.bf16_weights"] is False
    assert fp8["model.kernels"] == "none" and fp8["train.compile_scope"] == "blocks"
    assert fp8["train.fused_optimizer"] is True
    # under DDP the decoder stays per layer (DDP splits a graph at its buckets); bf16 weights stay
    ddp = chosen(
        on(H100, RECIPES / "llama3.2_1b_full_random.yaml", ["strategy=ddp-ds", "launch.nproc=2"])
    )
    assert ddp["train.bf16_weights"] is True and ddp["train.compile_scope"] == "blocks"


def test_lora_on_one_gpu_runs_one_process_with_cuda_graphs(on):
    plan = on(H100, RECIPES / "llama3_8b_lora_random.yaml")
    got = chosen(plan)
    assert plan.strategy == "single" and not plan.multiprocess  # the recipe says ddp-ds
    assert got["launch.one_process"] is True and got["train.compile_mode"] == "reduce-overhead"
    assert got["train.fused_optimizer"] is True and got["train.bf16_weights"] is False
    assert got["model.kernels"] == "none" and got["model.fp8_lm_head"] is False
    # rows of differing lengths: no CUDA graphs (one graph per shape)
    alpaca = ["data.source=alpaca", "data.path=x.json", "model.shape=tiny"]
    real = chosen(on(H100, RECIPES / "llama3_8b_lora_random.yaml", alpaca))
    assert real["train.compile_mode"] == "default"
    packed = chosen(
        on(H100, RECIPES / "llama3_8b_lora_random.yaml", alpaca + ["data.packing=true"])
    )
    assert packed["train.compile_mode"] == "reduce-overhead"
    # two GPUs: DDP stays
    two = on(H100, RECIPES / "llama3_8b_lora_random.yaml", ["launch.nproc=2"])
    assert two.strategy == "ddp-ds" and chosen(two)["launch.one_process"] is False


def test_mobilenet_at_500_px_takes_the_triton_kernels_and_small_images_do_not(on):
    got = chosen(on(H100, RECIPES / "mnist_sample_mobilenetv2_fastest.yaml"))
    assert got["model.depthwise_conv"] == "triton" and got["model.stem_conv"] == "depthwise"
    assert got["model.batchnorm"] == "triton" and got["train.channels_last"] is True
    assert got["train.cudnn_benchmark"] is True and got["train.compile_mode"] == "reduce-overhead"
    small = chosen(
        on(H100, RECIPES / "mnist_sample_mobilenetv2_fastest.yaml", ["data.image_size=64"])
    )
    assert small["model.depthwise_conv"] == "native" and small["train.channels_last"] is True
    fp16 = chosen(on(H100, RECIPES / "mnist_sample_mobilenetv2.yaml"))  # the seed's fp16 recipe
    assert fp16["model.depthwise_conv"] == "native" and fp16["train.compile"] is True
    cnn = chosen(on(H100, RECIPES / "tiny_cpu.yaml", ["device=auto"]))
    assert cnn["model.batchnorm"] == "native"  # measured on MobileNetV2 only


def test_without_triton_or_an_old_gpu_or_a_cpu_auto_is_plain(on):
    for machine in (NO_TRITON, Machine("cpu")):
        got = chosen(on(machine, RECIPES / "llama3.2_1b_full_random.yaml"))
        assert got["train.compile"] is False and got["train.bf16_weights"] is False
        assert got["model.kernels"] == "none" and got["train.compile_scope"] == "blocks"
    old = on(V100, RECIPES / "mnist_sample_mobilenetv2_fastest.yaml")
    got = chosen(old)
    assert got["train.compile"] is True and got["model.depthwise_conv"] == "native"
    reasons = {c.key: c.reason for c in old.levers}
    assert "8.0" in reasons["model.depthwise_conv"]
    cpu = on(Machine("cpu"), RECIPES / "tiny_cpu.yaml", ["launch.nproc=2"])
    assert "levers     plain (on the cpu" in "\n".join(show.lines(cpu))


def test_set_values_win_and_levers_plain_decides_nothing(on):
    plan = on(
        H100,
        RECIPES / "llama3.2_1b_full_random.yaml",
        ["train.bf16_weights=false", "train.compile_scope=blocks"],
    )
    got = {c.key: (c.value, c.by) for c in plan.levers}
    assert got["train.bf16_weights"] == (False, "set")
    assert got["train.compile_scope"] == ("blocks", "set")
    assert got["model.kernels"] == ("triton-loss", "auto")
    plain = on(H100, RECIPES / "llama3_8b_lora_random.yaml", ["levers=plain"])
    assert plain.strategy == "ddp-ds" and plain.multiprocess  # DDP on one rank, as the seed ran
    assert all(c.value == levers.PLAIN[c.key] for c in plain.levers if c.by == "plain")
    assert chosen(plain)["train.compile"] is False


def test_one_rank_keeps_ddp_where_the_run_asks_for_it(on):
    kept = on(H100, RECIPES / "llama3_8b_lora_random.yaml", ["launch.max_restarts=1"])
    assert kept.strategy == "ddp-ds"
    assert "restarts" in {c.key: c.reason for c in kept.levers}["launch.one_process"]
    with pytest.raises(ConfigError, match="launch.one_process: true, but sync.mode"):
        on(
            H100,
            RECIPES / "llama3_8b_lora_random.yaml",
            ["launch.one_process=true", "sync.mode=local_sgd"],
        )


def test_the_plan_json_keeps_every_lever_with_its_reason(on, tmp_path):
    from paratrain.runplan import RunPlan

    plan = on(H100, RECIPES / "mnist_sample_mobilenetv2_fastest.yaml")
    plan.save(tmp_path / "plan.json")
    again = RunPlan.load(tmp_path / "plan.json")
    assert again.levers == plan.levers and again.hints == plan.hints
    assert {c.key for c in plan.levers} == set(levers.PLAIN)
    assert all(c.reason for c in plan.levers)


def test_review_mends_fused_sgd_stem_and_the_recipes_strategy(on, monkeypatch):
    """Fused SGD has no DTensor rule (FSDP, TP); the stem follows the depthwise layers that run;
    config.yaml keeps the recipe's strategy, so one rank collapses again and two do not; a
    plan's other layouts take the levers back at auto."""
    sgd = ["train.optimizer=sgd", "model.name=resnet50", "data.image_size=64"]
    fsdp = chosen(
        on(H100, RECIPES / "mnist_sample_mobilenetv2_fastest.yaml", [*sgd, "strategy=fsdp"])
    )
    assert fsdp["train.fused_optimizer"] is False
    ddp = chosen(on(H100, RECIPES / "mnist_sample_mobilenetv2_fastest.yaml", sgd))
    assert ddp["train.fused_optimizer"] is True
    native = on(
        H100, RECIPES / "mnist_sample_mobilenetv2_fastest.yaml", ["model.depthwise_conv=native"]
    )
    assert chosen(native)["model.stem_conv"] == "native"
    one = on(H100, RECIPES / "llama3_8b_lora_random.yaml")
    assert one.strategy == "single" and one.config.strategy == "ddp-ds"
    from paratrain.config import from_dict
    from paratrain.config.run import RunConfig
    from paratrain.runplan import resolve

    saved = from_dict(RunConfig, one.config.to_dict())  # config.yaml, resolved on two GPUs
    monkeypatch.setattr(paratrain.launch.torchrun, "default_nproc", lambda several: 2)
    two = resolve(saved)
    assert two.strategy == "ddp-ds" and two.multiprocess and two.world_size == 2
    full = on(H100, RECIPES / "llama3.2_1b_full_random.yaml")
    back = levers.unsettled(full)
    assert back.train.bf16_weights == "auto" and back.train.compile_scope == "auto"
    assert full.config.train.bf16_weights is True  # the plan itself is left as it was
    fsdp_back = resolve(levers.put(back, "strategy", "fsdp") or back, world=2)
    assert fsdp_back.config.train.bf16_weights is False  # FSDP keeps fp32 shards itself
