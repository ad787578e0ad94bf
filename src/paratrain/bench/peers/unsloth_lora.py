"""Unsloth's LoRA, set up the way its documentation shows: FastLanguageModel.from_pretrained on a
model folder (16-bit, no quantization), FastLanguageModel.get_peft_model with the config's rank,
alpha, dropout and target modules, then the same loop as the transformers + peft peer (autocast,
model(...).loss, AdamW on the adapters). Unsloth's own kernels come with it (its RoPE, RMSNorm, LoRA
and cross-entropy paths); its gradient checkpointing ("unsloth": activations offloaded to the
host) is train.activation_checkpointing=true, off otherwise, so each row says which it used.

Unsloth loads a model only from a folder, so the config's random shape is built and written
as safetensors with paratrain's byte tokenizer into the run's own folder (random-weights/),
loaded from there, and removed again after loading: 16 GB for the 8B shape, made by this process.
With PARATRAIN_RANDOM_WEIGHTS=FOLDER the folder is kept there and the next row of the same
shape and seed loads it again (a sweep of several Unsloth rows writes 16 GB once); a folder that
is there without this peer's marker, or with another shape's, is refused, never overwritten.
One process, one GPU (Unsloth's multi-GPU training is not what this row measures).

    python -m paratrain.bench.peers.unsloth_lora CONFIG_YAML OUT_DIR
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from paratrain.bench.peers import common

WEIGHTS = "random-weights"  # the folder this peer writes (and removes) inside its run folder
MARKER = "paratrain-random-weights.json"  # what says a kept folder is this peer's, and of what
WRITING = "paratrain-writing"  # what says a .partial folder is this peer's write under way


def main() -> None:
    common.require("unsloth")
    plan, out_dir = common.read_plan("unsloth_lora")  # imports no transformers
    cfg = plan.config
    check_supported(cfg)
    if plan.nproc != 1:  # started as one process (bench's ONE_PROCESS): nothing else would say
        common.fail("unsloth_lora: runs one process on one GPU (launch.nproc=1)")
    # Unsloth patches transformers when imported, so before anything imports transformers.
    import unsloth  # noqa: F401

    device = common.pick_device(cfg, 0)
    torch.manual_seed(cfg.seed)
    kept = os.environ.get("PARATRAIN_RANDOM_WEIGHTS")
    folder = Path(kept) if kept else out_dir / WEIGHTS
    if not reusable(folder, cfg):
        write_random_model(cfg, folder, device)
    try:
        model = load_with_lora(cfg, folder)
    finally:
        if not kept:
            shutil.rmtree(folder)  # written by this process above, in its own run folder
    from paratrain.bench.peers.hf_lora import train_measured

    summary = train_measured(plan, model, model.config.vocab_size, device, torch.bfloat16)
    summary["unsloth"] = unsloth_facts(cfg)
    common.write_result(out_dir, "unsloth_lora", cfg, device, 1, summary)


def check_supported(cfg) -> None:
    """What this peer implements; anything else exits 2 before any work."""
    if (
        cfg.data.source != "synthetic-text"
        or cfg.model.path is not None
        or cfg.precision != "bf16"
        or not cfg.lora.enabled
        or cfg.model.kernels != "none"
        or cfg.train.compile
    ):
        common.fail(
            "unsloth_lora: runs LoRA on data.source=synthetic-text, model.init=random with a "
            "shape, bf16, with Unsloth's own kernels (model.kernels=none, train.compile=false)"
        )


def what(cfg) -> dict:
    return {"shape": cfg.model.shape, "layers": cfg.model.layers, "seed": cfg.seed}


def reusable(folder: Path, cfg) -> bool:
    """True for a folder this peer wrote for the same shape and seed; False where there is none;
    any other folder there is someone else's: refused."""
    if not folder.exists():
        return False
    try:
        ours = json.loads((folder / MARKER).read_text()) == what(cfg)
    except (OSError, ValueError):  # no marker, or not one this peer wrote
        ours = False
    if not ours:
        common.fail(f"random weights: {folder} exists and is not this shape's random model; "
                    "not touched")  # fmt: skip
    return True


def write_random_model(cfg, folder: Path, device: torch.device) -> None:
    """The config's shape with random weights (transformers' own init, the seed's), as a model
    folder Unsloth loads: config.json, safetensors, the byte tokenizer and the marker, written
    beside the folder and renamed into place: a half-written folder is never loaded, and one an
    earlier run of this peer left (it carries WRITING: a timeout kills with -9) is removed."""
    from paratrain.data.text.tokenizer import byte_tokenizer
    from paratrain.models.causal_lm.build import building, model_class, shape_config

    partial = folder.with_name(folder.name + ".partial")
    if partial.exists():
        if not (partial / WRITING).is_file():
            common.fail(f"random weights: {partial} exists and is not this peer's; not touched")
        shutil.rmtree(partial)  # this peer's own write, cut short
    partial.mkdir(parents=True)
    (partial / WRITING).write_text("being written by paratrain.bench.peers.unsloth_lora\n")
    try:
        config = shape_config(cfg.model.shape, cfg.model.layers, cfg.model.attn_implementation)
        config.use_cache = False
        with building(torch.bfloat16, device):
            model = model_class(config)(config)
        model.save_pretrained(partial, safe_serialization=True)
        byte_tokenizer().save_pretrained(partial)
        del model
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # made above by this process
        raise
    (partial / WRITING).unlink()
    (partial / MARKER).write_text(json.dumps(what(cfg)) + "\n")
    partial.rename(folder)
    if device.type == "cuda":
        torch.cuda.empty_cache()


def load_with_lora(cfg, folder: Path):
    """Unsloth's documented 16-bit LoRA set-up: from_pretrained, then get_peft_model."""
    from unsloth import FastLanguageModel

    from paratrain.models.causal_lm.lora import lora_targets

    model, _ = FastLanguageModel.from_pretrained(
        model_name=str(folder),
        max_seq_length=cfg.data.max_length,
        dtype=torch.bfloat16,
        load_in_4bit=False,
        load_in_16bit=True,
        local_files_only=True,
    )
    return FastLanguageModel.get_peft_model(
        model,
        r=cfg.lora.r,
        lora_alpha=cfg.lora.alpha,
        lora_dropout=cfg.lora.dropout,
        target_modules=lora_targets(model.config, cfg.lora),
        bias="none",
        use_gradient_checkpointing=checkpointing(cfg),
        random_state=cfg.seed,
    )


def checkpointing(cfg):
    """Unsloth's own gradient checkpointing (offloaded to the host) when the row asks for it."""
    return "unsloth" if cfg.train.activation_checkpointing else False


def unsloth_facts(cfg) -> dict:
    """What the row ran, for its result: the versions and which of Unsloth's options."""
    import importlib.metadata as md

    versions = {p: _version(md, p) for p in ("unsloth", "unsloth_zoo", "xformers", "bitsandbytes")}
    return {**versions, "use_gradient_checkpointing": checkpointing(cfg) or "off"}


def _version(md, package: str) -> str:
    try:
        return md.version(package)
    except md.PackageNotFoundError:
        return "absent"


if __name__ == "__main__":
    main()
