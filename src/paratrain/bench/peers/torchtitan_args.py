"""paratrain's run in torchtitan's terms, without importing torchtitan: its model arguments, its
command line, and what its log says. Pure functions, tested without torchtitan installed.

Two torchtitan interfaces, told apart by the installed version (`api`): 0.2.x takes a TOML/CLI
JobConfig and imports the peer's spec through `--experimental.custom_import` (torchtitan_spec);
0.3 and later take a Python Trainer.Config from a function named by `--module/--config`
(torchtitan_v03.paratrain_run, built from `settings_v03`)."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re

import torch

from paratrain.config import RunConfig, load_config, plain_levers

# What the torchtitan peer runs; anything else exits 2 before any work.
SUPPORTED_PRECISION = {"bf16": "bfloat16", "fp32": "float32"}


V03_MODULE = "paratrain.bench.peers.torchtitan_v03"
V03_CONFIG = "paratrain_run"
# torchtitan >= 0.3 splits the sequence into this many chunks for its loss (ChunkedLossWrapper,
# the loss its Llama configs use); the peer keeps its default
V03_LOSS_CHUNKS = 8
# torchtitan 0.3.0 imports torch.distributed.fsdp.DataParallelMeshDims (not in 2.11) and calls
# create_block_mask(separate_full_blocks=...) (not in 2.12): checked on the CPU with 2.11-2.13
V03_MIN_TORCH = (2, 13)


def api(version: str | None) -> str:
    """The interface of torchtitan `version`: v03 for 0.3 and later (Trainer.Config,
    --module/--config), v02 before (JobConfig, --experimental.custom_import). None or an
    unreadable version (a source checkout reports 0.0.0): v02 where the installed torchtitan
    has the TrainSpec registry the 0.2 peer uses (torchtitan.protocols.train_spec, gone in
    0.3), else v03."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if m and (int(m.group(1)), int(m.group(2))) != (0, 0):
        return "v03" if (int(m.group(1)), int(m.group(2))) >= (0, 3) else "v02"
    import importlib.util
    from pathlib import Path

    # the file, not an import: importing torchtitan's package would run its __init__, which may
    # import `datasets` before torchtitan_main's stand-in exists
    spec = importlib.util.find_spec("torchtitan")
    places = (spec.submodule_search_locations or []) if spec else []
    v02 = any((Path(p) / "protocols" / "train_spec.py").is_file() for p in places)
    return "v02" if v02 else "v03"


def installed_version() -> str | None:
    """torchtitan's version: its distribution's, else its __version__ (a source checkout)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchtitan")
    except PackageNotFoundError:
        try:
            import torchtitan
        except ImportError:
            return None
        return getattr(torchtitan, "__version__", None)


def unsupported(cfg: RunConfig, version: str | None = None) -> str | None:
    """Why torchtitan cannot run this config as paratrain does, or None (`version`: the
    installed torchtitan's, for what only one of its interfaces needs)."""
    cfg = plain_levers(copy.deepcopy(cfg))  # a lever left at auto: torchtitan's plain run
    if cfg.task not in ("causal_lm", "auto") or cfg.data.source != "synthetic-text":
        return "runs the causal_lm task on data.source=synthetic-text"
    if cfg.model.path is not None or cfg.model.shape is None or cfg.lora.enabled:
        return "trains every weight of a model.shape from random init (lora.enabled=false)"
    from paratrain.models.causal_lm.build import shape_config

    if shape_config(cfg.model.shape, cfg.model.layers).model_type != "llama":
        return f"model.shape {cfg.model.shape}: torchtitan's peer builds Llama shapes"
    if cfg.model.fp8_lm_head:
        return "model.fp8_lm_head: torchtitan keeps its output layer in bf16; set it false"
    if cfg.model.fp8 == "delayed":
        return "model.fp8: torchtitan scales float8 dynamically (tensorwise or rowwise)"
    if cfg.model.kernels != "none":
        return "model.kernels: torchtitan uses its own kernels; set model.kernels=none"
    if cfg.precision not in SUPPORTED_PRECISION:
        return f"precision {cfg.precision}: bf16 (autocast over fp32 weights) or fp32"
    if cfg.train.optimizer != "adamw" or cfg.train.grad_accum_steps != 1:
        return "runs AdamW, one batch per step"
    warm, steps = cfg.train.warmup_steps, cfg.train.max_steps or 0
    if warm < 1 or steps <= warm or steps % warm:
        # torchtitan logs (and syncs) every log_freq steps: one log at the warm-up's end and
        # whole windows after it, not a sync in every measured step
        return "needs train.max_steps a multiple of train.warmup_steps >= 1 (the measured window)"
    if version is not None and api(version) == "v03":
        return unsupported_v03(cfg, torch.__version__)
    return None


def unsupported_v03(cfg: RunConfig, torch_version: str) -> str | None:
    """What only torchtitan 0.3's interface refuses, or None."""
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    if m and (int(m.group(1)), int(m.group(2))) < V03_MIN_TORCH:
        need = ".".join(map(str, V03_MIN_TORCH))
        return f"torchtitan 0.3 needs torch {need} or later (this is {torch_version})"
    if cfg.data.max_length % V03_LOSS_CHUNKS:
        return f"data.max_length a multiple of {V03_LOSS_CHUNKS} (torchtitan's chunked loss)"
    return None


def ffn_sizing(dim: int, hidden: int) -> tuple[float, int]:
    """(ffn_dim_multiplier, multiple_of) with which torchtitan's FeedForward gets `hidden`
    (int(2 * 4 * dim / 3), times the multiplier, rounded up to multiple_of)."""
    base = int(2 * 4 * dim / 3)
    for multiple in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        for mult in (hidden / base, (hidden - multiple + 1) / base):
            h = int(mult * base)
            if multiple * ((h + multiple - 1) // multiple) == hidden:
                return mult, multiple
    raise ValueError(f"no torchtitan FFN sizing gives {hidden} for dim {dim}")


def _llama(cfg: RunConfig) -> tuple[object, dict]:
    """The config's Llama shape (transformers' config) and the fields both torchtitan versions
    name alike."""
    from paratrain.models.causal_lm.build import shape_config

    c = shape_config(cfg.model.shape, cfg.model.layers)
    if c.model_type != "llama":
        raise ValueError(f"model.shape {cfg.model.shape}: torchtitan's peer builds Llama shapes")
    rope = getattr(c, "rope_parameters", None) or {}
    return c, {
        "dim": c.hidden_size,
        "n_layers": c.num_hidden_layers,
        "n_heads": c.num_attention_heads,
        "n_kv_heads": c.num_key_value_heads,
        "vocab_size": c.vocab_size,
        "norm_eps": c.rms_norm_eps,
        "rope_theta": rope.get("rope_theta", getattr(c, "rope_theta", 500000.0)),
    }


def model_args(cfg: RunConfig) -> dict:
    """TransformerModelArgs' keywords for the config's Llama shape (torchtitan's embeddings are
    untied: the output layer is its own weight, whatever the shape ties). paratrain's shapes
    have no RoPE scaling; torchtitan's spec sets its scaling to the identity (factor 1)."""
    c, fields = _llama(cfg)
    mult, multiple = ffn_sizing(c.hidden_size, c.intermediate_size)
    return {**fields, "ffn_dim_multiplier": mult, "multiple_of": multiple}


def shape_v03(cfg: RunConfig) -> dict:
    """The Llama shape in torchtitan 0.3's terms (its FeedForward takes the hidden size itself).
    Untied embeddings, as the 0.2 peer (torchtitan's Llama-3.2 flavors tie them in 0.3); RoPE
    without scaling (paratrain's shapes have none: scaling "none" is torchtitan's identity)."""
    c, fields = _llama(cfg)
    return {
        **fields,
        "hidden_dim": c.intermediate_size,
        "rope_scaling": "none",
        "tie_embeddings": False,
    }


def settings_v03(cfg: RunConfig) -> dict:
    """What torchtitan 0.3's Trainer.Config is given (torchtitan_v03 builds it from this): the
    shape, batch, steps, precision, optimizer, schedule, clipping, compile, float8 and log
    cadence of the 0.2 peer's command line. Everything not here is torchtitan's default, and so
    is what torchtitan_v03 names in `defaults_kept`: CUDA graphs over forward+backward, its
    FlexAttention, its chunked cross-entropy, its SPMD backend, what it compiles."""
    cfg = plain_levers(copy.deepcopy(cfg))  # a lever left at auto: torchtitan's plain run
    t = cfg.train
    fp8 = None
    if cfg.model.fp8 != "none":
        # paratrain keeps the output layer in bf16, as torchao and torchtitan advise
        fp8 = {"recipe_name": cfg.model.fp8, "filter_fqns": ["lm_head"]}
    return {
        "shape": shape_v03(cfg),
        "training": {
            "local_batch_size": cfg.data.batch_size,
            "seq_len": cfg.data.max_length,
            "steps": t.max_steps,
            # torchtitan always clips; paratrain unclipped: an infinite norm multiplies by 1
            "max_norm": t.max_grad_norm if t.max_grad_norm is not None else math.inf,
            "dtype": "float32",
            "mixed_precision_param": SUPPORTED_PRECISION[cfg.precision],
        },
        "optimizer": {
            "name": "AdamW",
            "lr": t.lr,
            "betas": (t.adam_beta1, t.adam_beta2),
            "eps": 1e-8,  # torch's AdamW default, paratrain's
            "weight_decay": t.weight_decay,
            "implementation": "fused" if t.fused_optimizer else "foreach",
        },
        "lr_scheduler": {
            "warmup_steps": 0,
            # constant: a decay phase of length 0; cosine: decay from the first step to 0
            "decay_ratio": 0.0 if t.lr_schedule == "constant" else None,
            "decay_type": "linear" if t.lr_schedule == "constant" else "cosine",
            "min_lr_factor": 0.0,
        },
        "activation_checkpoint": "full" if t.activation_checkpointing else None,
        "compile": bool(t.compile),
        "float8": fp8,
        "log_freq": t.warmup_steps,  # a log at the end of the warm-up (unsupported checks it)
        "seed": cfg.seed,
    }


def command_args_v03(dump_folder: str) -> list[str]:
    """torchtitan.train's command line from 0.3 on: the config function (which reads the run's
    config from PARATRAIN_TT_CONFIG and builds everything from settings_v03), the output
    folder, and torchtitan's own record of the config it parsed (job_config.json there)."""
    return [
        "--module",
        V03_MODULE,
        "--config",
        V03_CONFIG,
        f"--dump_folder={dump_folder}",
        "--debug.save_config_file=job_config.json",
    ]


def run_config() -> RunConfig:
    return plain_levers(load_config(os.environ["PARATRAIN_TT_CONFIG"]))


def token_rows(cfg: RunConfig, length: int) -> torch.Tensor:
    """paratrain's synthetic-text rows (the same generator, seed and token range), `length`
    tokens each: torchtitan takes inputs and labels from one row shifted by one."""
    from paratrain.bench.peers.hf_lora import synthetic_rows
    from paratrain.models.causal_lm.build import shape_config

    vocab = shape_config(cfg.model.shape, cfg.model.layers).vocab_size
    longer = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, max_length=length))
    return synthetic_rows(longer, vocab)


def command_args(cfg: RunConfig, dump_folder: str, version: str | None = "0.2") -> list[str]:
    """torchtitan.train's command line for the run, for the torchtitan `version` installed
    (0.3 and later: command_args_v03). Up to 0.2: the same shape, batch, steps, precision,
    optimizer, clipping, compile and float8 as paratrain's config. torchtitan always clips
    (max_norm); paratrain without max_grad_norm is matched by an infinite norm (the norm is
    still computed and the gradients multiplied by 1)."""
    cfg = plain_levers(copy.deepcopy(cfg))  # a lever left at auto: torchtitan's plain run
    if api(version) == "v03":
        return command_args_v03(dump_folder)
    t = cfg.train
    steps, warm = t.max_steps, t.warmup_steps
    args = {
        "job.dump_folder": dump_folder,
        "model.name": "paratrain",
        "model.flavor": "shape",
        "experimental.custom_import": "paratrain.bench.peers.torchtitan_spec",
        "training.local_batch_size": cfg.data.batch_size,
        "training.seq_len": cfg.data.max_length,
        "training.steps": steps,
        "training.max_norm": t.max_grad_norm if t.max_grad_norm is not None else math.inf,
        "training.dtype": "float32",
        "training.mixed_precision_param": SUPPORTED_PRECISION[cfg.precision],
        "optimizer.lr": t.lr,
        "optimizer.beta1": t.adam_beta1,
        "optimizer.beta2": t.adam_beta2,
        "optimizer.weight_decay": t.weight_decay,
        "optimizer.implementation": "fused" if t.fused_optimizer else "foreach",
        "lr_scheduler.warmup_steps": 0,
        "activation_checkpoint.mode": "full" if t.activation_checkpointing else "none",
        "metrics.log_freq": warm,  # a log at the end of the warm-up (unsupported checks it)
        "debug.seed": cfg.seed,
    }
    if t.lr_schedule == "constant":
        args["lr_scheduler.decay_ratio"] = 0.0
    else:
        args["lr_scheduler.decay_type"] = "cosine"
    out = [f"--{k}={v}" for k, v in args.items()]
    if t.compile:
        out.append("--compile.enable")
    if cfg.model.fp8 != "none":
        out += [
            "--model.converters=quantize.linear.float8",
            f"--quantize.linear.float8.recipe_name={cfg.model.fp8}",
            # paratrain keeps the output layer in bf16, as torchao and torchtitan advise
            "--quantize.linear.float8.filter_fqns=output",
        ]
    return out


ANSI = re.compile(r"\x1b\[[0-9;]*m")
STEP = re.compile(
    r"step:\s*(\d+)\s+loss:\s*([-\d.e+naif]+).*?memory:\s*([\d.]+)GiB.*?tps:\s*([\d,]+)"
    r".*?mfu:\s*(?:([\d.]+)%|N/A)"  # torchtitan 0.3 prints N/A under float8
)


def read_log(text: str) -> list[dict]:
    """torchtitan's metric lines: step, loss, reserved memory (GiB), tokens/s and its own MFU
    (%; None where it prints none), each over the steps since the previous line."""
    rows, seen = [], set()
    for line in ANSI.sub("", text).splitlines():
        m = STEP.search(line)
        if m and int(m.group(1)) not in seen:  # every rank prints the line: the first stands
            step, loss, mem, tps, mfu = m.groups()
            seen.add(int(step))
            rows.append(
                {
                    "step": int(step),
                    "loss": float(loss),
                    "memory_gib": float(mem),
                    "tps": float(tps.replace(",", "")),
                    "mfu_pct": float(mfu) if mfu is not None else None,
                }
            )
    return rows


def measured(rows: list[dict], warmup: int, tokens_per_step: int) -> dict:
    """Tokens/s over the steps after the warm-up, from the windows that start there: the
    window's tokens over its time, summed (the window lengths come from the steps logged)."""
    tokens, seconds, prev, steps = 0.0, 0.0, 0, 0
    for r in rows:
        window = r["step"] - prev
        if prev >= warmup and window > 0:
            t = window * tokens_per_step
            tokens, seconds, steps = tokens + t, seconds + t / r["tps"], steps + window
        prev = r["step"]
    if not steps:
        raise ValueError(f"no torchtitan log line after step {warmup}")
    return {"tokens_per_s": tokens / seconds, "measured_steps": steps, "seconds": seconds}
