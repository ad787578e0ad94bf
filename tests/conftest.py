import gzip
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

# One thread a process, here and in every process a test starts (paratrain keeps a set
# OMP_NUM_THREADS): the suite runs three pytest workers on two cores, each starting runs of
# two processes; at the cores' count of threads each, OpenMP's threads wait for cores the
# others hold, and a float64 MobileNetV2 step took 70 s instead of 0.05 s.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "recipes"


def train(plan):
    """One rank's run in this process (trainer.loop.train), from a RunConfig too: resolved to
    its plan here, as the command and paratrain.train do (the trainer takes a plan and never
    re-enters runplan)."""
    from paratrain.runplan import RunPlan, resolve
    from paratrain.trainer import loop

    return loop.train(plan if isinstance(plan, RunPlan) else resolve(plan))


@pytest.fixture
def one_rank_group():
    """A one-process gloo group here: DDP wrappers and hooks run without launching anything."""
    import torch.distributed as dist

    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def spawn_ranks(target, world: int, folder: Path, timeout: float = 180) -> dict:
    """target(rank, init_method, queue) in `world` spawned processes over a file rendezvous in
    `folder`; each puts (rank, plain values) on the queue (a shared tensor would vanish with its
    process) -> {rank: value}. Every process must exit 0."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{folder / 'rdzv'}"
    procs = [ctx.Process(target=target, args=(r, init, out)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=timeout) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return got


def run_cli(args, *, timeout=300, env=None, module="paratrain", check=True, unset=()):
    """Run `python -m paratrain ARGS` (or another module) in a subprocess; return the result.
    `unset`: variables left out of its environment (as a user's shell would not have them)."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    for name in unset:
        full_env.pop(name, None)
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def run_in_triton_interpreter(code: str) -> None:
    """`code` in a process of its own with TRITON_INTERPRET=1 (read when kernels are defined,
    so it cannot be set in this one); it must print "kernels ok"."""
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0 and "kernels ok" in p.stdout, p.stderr[-3000:]


def assert_same_step_float64(model, ref, batch: int = 2, side: int = 40) -> None:
    """One training step of two image models (1 input channel, dropout off) in float64 on one
    batch: the same output and gradients. float64, as layers swapped for other forms may sum
    in another order, which a deep fp32 model amplifies past any tight tolerance."""
    import torch

    model, ref = model.double(), ref.double()
    x = torch.randn(batch, 1, side, side, dtype=torch.float64)
    outs = []
    for m in (model, ref):
        m.classifier[0].p = 0.0  # no dropout: the two would draw different masks
        outs.append(m(x))
        outs[-1].square().sum().backward()
    assert torch.allclose(*outs, atol=1e-12)
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, rtol=1e-9, atol=1e-9)


def same_plan(plan) -> dict:
    """A plan as resolving its saved config again gives it: notes said once, and each lever by
    its value (decided by auto the first time, as set in the config.yaml that records it)."""
    d = plan.to_dict()
    return {**d, "notes": [], "levers": {c["key"]: c["value"] for c in d["levers"]}}


def one_error_line(capsys, *needles):
    """What a refused command printed: one line on stderr, `paratrain: error: ...`, holding
    each needle."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("paratrain: error: "), err
    for needle in needles:
        assert needle in err, err
    return err


def read_result(run_dir) -> dict:
    return json.loads((Path(run_dir) / "result.json").read_text())


def last_checkpoint(run_dir) -> Path:
    from paratrain.checkpoint import list_checkpoints

    ckpts = list_checkpoints(Path(run_dir) / "checkpoints")
    assert ckpts, f"no checkpoint in {run_dir}"
    return ckpts[-1]


def read_ckpt(path) -> dict:
    """A checkpoint folder (DCP) as plain tensors: model, optimizer, loop, rng per rank."""
    from paratrain.checkpoint import read_checkpoint

    return read_checkpoint(path)


def final_weights(run_dir) -> dict:
    return read_ckpt(last_checkpoint(run_dir))["model"]


# A tiny random Llama on random tokens, on the CPU: the model-parallel, resharding, restart
# and fault-tolerance tests add their own steps, batch and degrees.
TINY_LM = [
    "data.source=synthetic-text",
    "model.init=random",
    "model.shape=tiny",
    "device=cpu",
    "data.num_workers=0",
    "data.max_length=32",
    "train.warmup_steps=1",
    "log.progress=false",
]


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


# A tiny, exact-comparison friendly run: tiny CNN (no BatchNorm, no dropout), CPU, SGD.
TINY_SETTINGS = [
    "model.name=tiny_cnn",
    "device=cpu",
    "data.num_workers=0",
    "train.optimizer=sgd",
    "train.lr=0.05",
    "log.progress=false",
    "train.eval=false",
]
TINY = [arg for setting in TINY_SETTINGS for arg in ("--set", setting)]


@pytest.fixture
def tiny_overrides():
    return list(TINY)


def write_idx(path, array, compress=False):
    """The MNIST IDX format: magic (0x08 = ubyte, then the rank), big-endian dims, bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    data = header + array.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)


def make_mnist_dir(root, n_train=200, n_test=50, compress=False):
    from paratrain.data.sources import mnist_sample_arrays

    x, y = mnist_sample_arrays()
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    write_idx(raw / "train-images-idx3-ubyte", x[:n_train], compress)
    write_idx(raw / "train-labels-idx1-ubyte", y[:n_train], compress)
    write_idx(raw / "t10k-images-idx3-ubyte", x[-n_test:], compress)
    write_idx(raw / "t10k-labels-idx1-ubyte", y[-n_test:], compress)
    return x, y


def pytest_collection_modifyitems(config, items):
    """GPU tests run on a machine with CUDA (the lent device machine); elsewhere they skip."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


WORDS = ["apple", "berry", "cherry", "grape", "lemon", "mango", "peach", "plum"]


def write_alpaca(path, n=64):
    """A small Alpaca-format file: repeat a word three times (learnable by a tiny model)."""
    records = [
        {"instruction": f"Repeat the word {w}.", "input": "", "output": f"{w} {w} {w}"}
        for w in (WORDS * (n // len(WORDS) + 1))[:n]
    ]
    path.write_text(json.dumps(records))
    return path


def lm_settings(data_path):
    """A tiny random Llama with LoRA on the CPU."""
    return [
        "data.source=alpaca",
        f"data.path={data_path}",
        "model.init=random",
        "model.shape=tiny",
        "device=cpu",
        "data.num_workers=0",
        "data.batch_size=4",
        "train.lr=0.01",
        "log.progress=false",
        "data.max_length=256",
        "train.optimizer=sgd",
        "train.momentum=0.9",
    ]


def adapter_logits(run_dir, checkpoint=None, seed=0):
    """Logits of the trained model rebuilt two ways: peft's loader on the saved adapter, and the
    same base with the checkpoint's adapter weights. -> (from_adapter, from_checkpoint, base)."""
    from peft import LoraConfig as PeftLora
    from peft import PeftModel, get_peft_model

    from paratrain.models.causal_lm.build import build_causal_lm

    def base():
        torch.manual_seed(seed)  # paratrain seeds the same way before building the model
        return build_causal_lm(None, "random", "tiny", "sdpa", torch.float32).eval()

    ids = torch.tensor([[256, 82, 101, 112, 101, 97, 116]])
    with torch.no_grad():
        plain = base()(input_ids=ids).logits
        loaded = (
            PeftModel.from_pretrained(base(), str(Path(run_dir) / "adapter"))
            .eval()(input_ids=ids)
            .logits
        )
        cfg = PeftLora(
            r=8, lora_alpha=16.0, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "o_proj"]
        )
        manual = get_peft_model(base(), cfg)
        state = read_ckpt(checkpoint or last_checkpoint(run_dir))
        missing = manual.load_state_dict(state["model"], strict=False)
        assert not missing.unexpected_keys
        from_ckpt = manual.eval()(input_ids=ids).logits
    return loaded, from_ckpt, plain


# ------------------------------------------------------------------- the case studies' runs


def sets(*settings):
    return [a for s in settings for a in ("--set", s)]


def launch(out, *settings, nproc=2):
    run_cli(["run", *sets(*settings), "--nproc", nproc, "--output-dir", out])
    return out


def step_losses(out):
    return [json.loads(x)["loss"] for x in (out / "steps.jsonl").read_text().splitlines()]
