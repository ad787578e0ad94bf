"""GPU behaviour: NCCL, pinned memory, device-side resize, prefetch stream, tf32 switches.
Marked `gpu`: skipped without CUDA; run on the lent GPU machine."""

import pytest
import torch
from conftest import final_weights, read_result, run_cli

from paratrain.data.device import DeviceLoader
from paratrain.data.sources import load_mnist_sample
from paratrain.data.transforms import Prepared
from paratrain.trainer.precision import build_policy

pytestmark = pytest.mark.gpu
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")

GPU_RUN = [
    "--set",
    "model.name=tiny_cnn",
    "--set",
    "log.progress=false",
    "--set",
    "data.num_workers=2",
    "--set",
    "data.limit_samples=1024",
    "--set",
    "data.batch_size=32",
    "--set",
    "train.optimizer=sgd",
    "--set",
    "train.lr=0.05",
]


def test_gpu_resize_matches_cpu_resize():
    src = load_mnist_sample()
    cpu = torch.stack(
        [Prepared(src.train, 500, src.mean, src.std, on_cpu=True)[i][0] for i in range(8)]
    )
    raw = torch.stack([src.train[i][0] for i in range(8)]).pin_memory()
    dev = torch.device("cuda", 0)
    loader = DeviceLoader(
        [(raw, torch.zeros(8, dtype=torch.long))],
        dev,
        dtype=torch.float32,
        size=500,
        mean=src.mean,
        std=src.std,
        finish_on_device=True,
        non_blocking=True,
        channels_last=False,
        prefetch=True,
    )
    x, y = next(iter(loader))
    assert x.device == dev and x.shape == (8, 1, 500, 500)
    torch.testing.assert_close(x.cpu(), cpu, atol=1e-4, rtol=1e-4)


def test_prefetch_stream_yields_the_same_batches():
    dev = torch.device("cuda", 0)
    batches = [
        (torch.randint(0, 255, (4, 1, 28, 28), dtype=torch.uint8).pin_memory(), torch.arange(4))
        for _ in range(5)
    ]
    kw = dict(
        dtype=torch.float32,
        size=64,
        mean=(0.5,),
        std=(0.5,),
        finish_on_device=True,
        non_blocking=True,
        channels_last=True,
    )
    a = [x.cpu() for x, _ in DeviceLoader(batches, dev, prefetch=True, **kw)]
    b = [x.cpu() for x, _ in DeviceLoader(batches, dev, prefetch=False, **kw)]
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


def test_fp32_is_ieee_and_tf32_uses_tensor_cores():
    dev = torch.device("cuda", 0)
    build_policy("fp32", dev)
    assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cudnn.allow_tf32
    build_policy("tf32", dev)
    assert torch.get_float32_matmul_precision() == "high" and torch.backends.cudnn.allow_tf32


def test_single_gpu_run_pins_memory(tmp_path):
    out = tmp_path / "one"
    run_cli(
        [
            "run",
            *GPU_RUN,
            "--set",
            "precision=bf16",
            "--set",
            "train.max_steps=10",
            "--output-dir",
            out,
        ]
    )
    r = read_result(out)
    assert r["hardware"]["device_type"] == "cuda" and r["effective"]["pin_memory"] is True
    assert r["summary"]["peak_memory_kind"] == "cuda_max_allocated"


def test_energy_and_phases_on_a_gpu(tmp_path):
    """NVML's energy counter over the measured steps, and the step's phases with the GPU time
    of the kernels each launched (together the profiled kernel time, within the profiler's
    own bookkeeping)."""
    out = tmp_path / "energy"
    run_cli(
        ["run", *GPU_RUN, "--set", "train.max_steps=30", "--set", "train.warmup_steps=5"]
        + ["--set", "train.profile_steps=3", "--set", "train.eval=false", "--output-dir", out]
    )
    s = read_result(out)["summary"]
    e = s["energy"]
    assert e["method"] == "nvml_total_energy" and e["joules"] > 0 and e["gpus"] == 1
    assert 5 < e["mean_power_w_per_gpu"] < 2000  # a GPU's draw, not a unit slip
    phases = s["profile_phases"]["phases"]
    assert phases["forward"]["gpu_ms"] > 0 and phases["backward"]["gpu_ms"] > 0


@two_gpus
@pytest.mark.parametrize("mode", ["stale", "diloco"])
def test_sync_modes_over_nccl(tmp_path, mode):
    """sync.mode over NCCL: trains (finite loss), counts its bytes, resumes from its replicas."""
    common = [*GPU_RUN, "--set", "train.max_steps=8", "--set", "train.eval=false"]
    common += ["--set", "strategy=ddp-ds", "--nproc", "2", "--set", f"sync.mode={mode}"]
    common += ["--set", "sync.every_steps=3", "--set", "checkpoint.every_steps=4"]
    run_cli(["run", *common, "--output-dir", tmp_path / "a"])
    r = read_result(tmp_path / "a")
    assert r["backend"] == "nccl" and r["summary"]["communication"]["bytes_sent"] > 0
    start = tmp_path / "a" / "checkpoints" / "step_00000004"
    assert len(list(start.glob("replica_rank*.pt"))) == 2
    run_cli(["run", *common, "--set", f"checkpoint.resume={start}", "--output-dir", tmp_path / "b"])
    assert read_result(tmp_path / "b")["summary"]["steps_this_run"] == 4


@two_gpus
def test_ddp_ds_on_two_gpus_matches_single_gpu(tmp_path):
    ddp, single = tmp_path / "ddp", tmp_path / "single"
    common = [*GPU_RUN, "--set", "train.max_steps=8", "--set", "train.eval=false"]
    run_cli(
        [
            "run",
            *common,
            "--set",
            "strategy=ddp-ds",
            "--nproc",
            "2",
            "--set",
            "data.resize_on=gpu",
            "--set",
            "data.prefetch_to_device=true",
            "--output-dir",
            ddp,
        ]
    )
    run_cli(["run", *common, "--set", "data.batch_size=64", "--output-dir", single])
    r = read_result(ddp)
    assert r["backend"] == "nccl" and r["world_size"] == 2
    a, b = final_weights(ddp), final_weights(single)
    # IEEE fp32 on both sides (tf32 off); the GPU's reduction order differs from one GPU's
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4


@two_gpus
def test_dp_uses_every_gpu(tmp_path):
    out = tmp_path / "dp"
    run_cli(
        ["run", *GPU_RUN, "--set", "strategy=dp", "--set", "train.max_steps=4", "--output-dir", out]
    )
    r = read_result(out)
    assert (
        r["dp_gpus"] == torch.cuda.device_count()
        and r["effective"]["loader_batch"] == 32 * r["dp_gpus"]
    )


@two_gpus
def test_fp16_ddp_on_two_gpus(tmp_path):
    out = tmp_path / "fp16"
    run_cli(
        [
            "run",
            *GPU_RUN,
            "--set",
            "strategy=ddp-ds",
            "--set",
            "precision=fp16",
            "--nproc",
            "2",
            "--set",
            "train.epochs=2",
            "--output-dir",
            out,
        ]
    )
    s = read_result(out)["summary"]
    assert s["loss_scale"] > 0 and s["val_accuracy"] > 0.5


@two_gpus
def test_comm_on_nccl(tmp_path):
    import json

    out = tmp_path / "comm"
    run_cli(["comm", "--nproc", "2", "--max-bytes", "1M", "--iters", "3", "--out", out])
    result = json.loads((out / "result.json").read_text())
    assert result["backend"] == "nccl" and len(result["rows"]) == 5 * 11
    assert all(r["busbw_gbps"] > 0 for r in result["rows"])


@two_gpus
@pytest.mark.parametrize("kind", ["bf16", "int8", "powersgd"])
def test_compressed_all_reduce_over_nccl(tmp_path, kind):
    """ddp.gradient_compression's hooks on NCCL: close to the uncompressed run, not equal."""
    common = [*GPU_RUN, "--set", "train.max_steps=8", "--set", "train.eval=false"]
    common += ["--set", "strategy=ddp-ds", "--nproc", "2", "--set", "train.deterministic=true"]
    run_cli(["run", *common, "--output-dir", tmp_path / "exact"])
    extra = ["--set", "ddp.powersgd_start_step=2"] if kind == "powersgd" else []
    run_cli(
        ["run", *common, "--set", f"ddp.gradient_compression={kind}", *extra]
        + ["--output-dir", tmp_path / kind]
    )
    a, b = final_weights(tmp_path / "exact"), final_weights(tmp_path / kind)
    diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
    assert 1e-6 < diff < 1e-1, diff
    assert read_result(tmp_path / kind)["backend"] == "nccl"


@two_gpus
def test_pipeline_over_nccl_matches_single_gpu(tmp_path):
    """strategy=pipeline on 2 GPUs: activations and their gradients cross between the GPUs by
    NCCL send/recv; the update equals one GPU's on the whole batch (the tiny CNN, fp32)."""
    common = [*GPU_RUN, "--set", "train.max_steps=8", "--set", "train.eval=true"]
    run_cli(["run", *common, "--output-dir", tmp_path / "single"])
    run_cli(
        ["run", *common, "--set", "strategy=pipeline", "--nproc", "2"]
        + ["--set", "pipeline.microbatches=4", "--output-dir", tmp_path / "pipe"]
    )
    r = read_result(tmp_path / "pipe")
    assert r["backend"] == "nccl" and r["world_size"] == 2
    a, b = final_weights(tmp_path / "pipe"), final_weights(tmp_path / "single")
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-4
    single_acc = read_result(tmp_path / "single")["summary"]["val_accuracy"]
    assert abs(r["summary"]["val_accuracy"] - single_acc) < 0.01


BN_MODEL = (
    "from torch import nn\n"
    "def build(num_classes, in_channels):\n"
    "    return nn.Sequential(nn.Conv2d(in_channels, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),\n"
    "                         nn.Flatten(), nn.Linear(8 * 26 * 26, num_classes))\n"
)


@two_gpus
def test_sync_batchnorm_two_ranks_equal_one_at_twice_the_batch(tmp_path):
    """model.sync_batchnorm: the BatchNorm statistics are the whole batch's, so DDP on 2 GPUs at
    batch 16 each takes the steps one GPU takes at batch 32 (plain BatchNorm would not: each
    rank normalises its own half)."""
    (tmp_path / "bn.py").write_text(BN_MODEL)
    common = [
        *GPU_RUN,
        *("--set", "model.name=bn:build", "--set", "train.max_steps=6"),
        *("--set", "train.deterministic=true", "--set", "train.eval=false"),
        *("--set", "data.shuffle=false", "--set", "ddp.broadcast_buffers=true"),
    ]
    env = {"PYTHONPATH": str(tmp_path)}
    one, two, plain = tmp_path / "one", tmp_path / "two", tmp_path / "plain"
    run_cli(
        [
            "run",
            *common,
            "--set",
            "strategy=single",
            "--set",
            "data.batch_size=32",
            "--output-dir",
            one,
        ],
        env=env,
    )
    for out, sync in ((two, "true"), (plain, "false")):
        run_cli(
            [
                "run",
                *common,
                "--set",
                "strategy=ddp-ds",
                "--set",
                "data.batch_size=16",
                "--set",
                f"model.sync_batchnorm={sync}",
                "--nproc",
                2,
                "--output-dir",
                out,
            ],
            env=env,
        )
    a, b, c = final_weights(one), final_weights(two), final_weights(plain)
    diff = max((a[k] - b[k]).abs().max().item() for k in a if "num_batches" not in k)
    apart = max((a[k] - c[k]).abs().max().item() for k in a if "num_batches" not in k)
    assert diff < 1e-4 and apart > 10 * diff, (diff, apart)


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torchtitan") is None,
    reason="torchtitan is not installed (carried as a wheel on the GPU machine)",
)
def test_torchtitan_peer_trains_the_same_rows_as_paratrain(tmp_path):
    """The torchtitan peer (issue 34) on the tiny Llama shape: its own Trainer runs, its log is
    read into result.json, and its loss ends where paratrain's does on the same random rows
    (both fall to about ln(259): the byte tokenizer's ids, uniformly drawn). The first steps
    differ: torchtitan initialises its own way (on the H200 the 40-step means were 5.98 and
    5.63), so the last 10 steps are compared."""
    import json
    import math
    import subprocess
    import sys

    from paratrain.config import load_config, to_yaml

    settings = [
        "model.shape=tiny",
        "data.source=synthetic-text",
        "model.init=random",
        "lora.enabled=false",
        "precision=bf16",
        "data.max_length=64",
        "data.batch_size=8",
        "train.max_steps=40",
        "train.warmup_steps=10",
        "train.lr=0.003",
        "train.max_grad_norm=1.0",
        "train.eval=false",
        "log.progress=false",
        "checkpoint.at_end=false",
        "data.num_workers=0",
    ]
    cfg_path = tmp_path / "config.yaml"
    cfg_path.write_text(to_yaml(load_config(None, settings)))
    tt = tmp_path / "tt"
    subprocess.run(
        [sys.executable, "-m", "paratrain.bench.peers.torchtitan_ref", str(cfg_path), str(tt)],
        check=True,
        timeout=600,
    )
    r = json.loads((tt / "result.json").read_text())
    s = r["summary"]
    assert r["program"] == "torchtitan" and s["measured_steps"] == 30 and len(s["losses"]) == 40
    assert s["tokens_per_s"] > 0 and s["mfu"] is not None
    run_cli(["run", *[a for x in settings for a in ("--set", x)], "--output-dir", tmp_path / "pt"])
    points = [json.loads(x) for x in (tmp_path / "pt" / "steps.jsonl").read_text().splitlines()]
    ours = [p["loss"] for p in points if p["step"] > 30 and p.get("loss") is not None]
    theirs = s["losses"][30:]
    a, b = sum(ours) / len(ours), sum(theirs) / len(theirs)
    assert abs(a - b) < 0.02 * b and b < math.log(320), (a, b)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_frozen_fp8_layers_match_torchao_on_the_gpu(recipe):
    """fp8_frozen.py on CUDA's float8 matmuls (cuBLAS / CUTLASS, not the CPU's): the output and
    the input's gradient equal torchao's Float8Linear, eager and compiled, under bf16 autocast."""
    import copy

    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 matmuls need compute capability 8.9+")
    from torch import nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from paratrain.models.causal_lm.fp8_frozen import FrozenFloat8Linear, freeze_fp8

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(256, 512, bias=False), nn.Linear(512, 256, bias=False))
    base = base.to("cuda", torch.bfloat16).requires_grad_(False)
    convert_to_float8_training(base, config=Float8LinearConfig.from_recipe_name(recipe))
    frozen = freeze_fp8(copy.deepcopy(base))
    assert all(isinstance(m, FrozenFloat8Linear) for m in frozen)
    x = torch.randn(4, 64, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    for compiled in (False, True):
        got = []
        for model in (base, frozen):
            run = torch.compile(model) if compiled else model
            for _ in range(2 if compiled else 1):  # compile, then the measured pass
                x.grad = None
                with torch.autocast("cuda", torch.bfloat16):
                    y = run(x)
                y.float().square().sum().backward()
            got.append((y.detach(), x.grad.clone()))
        (y0, g0), (y1, g1) = got
        assert torch.equal(y0, y1) and torch.equal(g0, g1), (compiled, (y0 - y1).abs().max())


@pytest.mark.parametrize("compiled", [False, True])
def test_delayed_fp8_starts_as_torchao_on_the_gpu(compiled):
    """fp8_delayed.py on CUDA's float8 matmuls, under bf16 autocast: steps whose inputs keep
    their amax equal torchao's tensorwise layers bit for bit (output, input and weight
    gradients); a step whose amax moves by 0.7x differs, by float8's rounding only. Compiled,
    the first (dynamic) step is bit for bit and the later ones close: a scale computed by a
    kernel of its own may round differently from one fused with its amax (call 12)."""
    import copy

    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 matmuls need compute capability 8.9+")
    from torch import nn
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    from paratrain.models.causal_lm.fp8_delayed import delay_fp8

    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(256, 512, bias=False), nn.Linear(512, 256, bias=False)).cuda()
    config = Float8LinearConfig.from_recipe_name("tensorwise")
    ref = convert_to_float8_training(copy.deepcopy(base), config=config)
    delayed = delay_fp8(convert_to_float8_training(copy.deepcopy(base), config=config))
    runs = [torch.compile(m) if compiled else m for m in (delayed, ref)]
    x = torch.randn(4, 64, 256, device="cuda")
    same = []
    for factor in (1.0, 1.0, 1.0, 0.7):
        got = []
        for model, run in zip((delayed, ref), runs, strict=True):
            xi = (x * factor).requires_grad_()
            with torch.autocast("cuda", torch.bfloat16):
                y = run(xi)
            y.float().square().sum().backward()
            got.append((y.detach(), xi.grad, [p.grad for p in model.parameters()]))
            model.zero_grad(set_to_none=True)
        (y0, g0, w0), (y1, g1, w1) = got
        same.append(
            torch.equal(y0, y1)
            and torch.equal(g0, g1)
            and all(torch.equal(a, b) for a, b in zip(w0, w1, strict=True))
        )
        if factor == 0.7 or compiled:
            torch.testing.assert_close(y0.float(), y1.float(), rtol=0.1, atol=0.1)
    # compiled, steps 2-3 may round differently (call 13: [True, False, False, False])
    assert same[0] and (compiled or same == [True, True, True, False])


def test_step_log_points_read_off_the_gpu_match_the_epoch(tmp_path):
    """The step log's GPU values (the loss, the gradient norm, the token count) arrive through
    pinned copies read once they have landed (trainer/report.py): every point is written, and
    their losses average to the epoch's, as tests/unit/test_steplog.py checks on the CPU."""
    import json

    from conftest import TINY_LM, train

    from paratrain.config import load_config

    out = tmp_path / "run"
    settings = [*TINY_LM, "device=cuda", "lora.enabled=false", "train.max_steps=6"]
    result = train(load_config(None, [*settings, "log.every_steps=2", f"output_dir={out}"]))
    points = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    assert [p["step"] for p in points] == [2, 4, 6]
    for p in points:
        assert p["loss"] > 0 and p["grad_norm"] > 0 and p["tokens_per_s"] > 0
    mean = sum(p["loss"] for p in points) / 3
    assert mean == pytest.approx(result["epochs"][0]["train_loss"], rel=1e-6)


def test_the_profiled_steps_list_the_hosts_syncs_and_a_log_point_makes_none(tmp_path):
    """profile.txt lists where the host waited for the GPU in the profiled steps (syncs.py);
    with the device's NaN verdict (fused AdamW) and a step-log point every step, none of them
    is the step log's: a point reads the host's clock (TrainClock.queued), not the device's."""
    from conftest import TINY_LM, train

    from paratrain.config import load_config

    out = tmp_path / "run"
    settings = [*TINY_LM, "device=cuda", "lora.enabled=false", "train.max_steps=8"]
    settings += ["train.fused_optimizer=true", "train.profile_steps=3", "log.every_steps=1"]
    train(load_config(None, [*settings, f"output_dir={out}"]))
    text = (out / "profile.txt").read_text()
    section = text.split("host syncs (the host waiting for the GPU) per step:")[1]
    section = section.split("operators by")[0]
    print(section)
    assert "report.py" not in section and "metrics.py" not in section


@pytest.mark.parametrize("writer, reader", [("fused", "foreach"), ("foreach", "fused")])
def test_a_loaded_optimizer_keeps_its_flags_and_its_steps_where_they_want_them(writer, reader):
    """A checkpoint of one AdamW implementation loaded by another (a resume under other
    levers): loading places each step count by the writer's flags; keep_implementation puts back
    the reader's flags and its step counts where its update reads them (fused: on the GPU;
    foreach: on the CPU, else the host syncs once a tensor every step)."""
    from paratrain.checkpoint.store import keep_implementation

    p = torch.nn.Parameter(torch.randn(64, device="cuda"))
    p.grad = torch.ones_like(p)
    first = torch.optim.AdamW([p], lr=0.1, **{writer: True})
    first.step()
    second = torch.optim.AdamW([p], lr=0.1, **{reader: True})
    second.load_state_dict(first.state_dict())
    assert second.state[p]["step"].device.type == ("cuda" if writer == "fused" else "cpu")
    keep_implementation(second)
    group = second.param_groups[0]
    assert group[reader] and not group[writer]
    assert second.state[p]["step"].device.type == ("cuda" if reader == "fused" else "cpu")
    second.step()  # the update runs with the steps where it reads them
    torch.cuda.synchronize()
    assert float(second.state[p]["step"]) == 2.0
