"""`paratrain export`: one checkpoint (DCP shards of any layout) as one consolidated model for
users who want a single file: a causal LM as a Hugging Face folder (`from_pretrained` loads
it; a LoRA run's adapter in peft's format, which `PeftModel.from_pretrained` loads onto the
base), any other model as one model.safetensors under its own parameter names
(`model.load_state_dict(safetensors.torch.load_file(...))`). Runs in one process, on the CPU."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from paratrain.errors import UserError
from paratrain.trust import reading_config_of, run_folder_of


def export(checkpoint: str | Path, out: str | Path, config: str | Path | None = None) -> dict:
    """-> what was written: {"format", "files", "step", "source"}."""
    from paratrain.checkpoint import resolve_resume
    from paratrain.config import load_config

    source = resolve_resume(checkpoint)
    cfg_path = Path(config) if config else source.parent.parent / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(
            f"export: no run config at {cfg_path} (the run folder's config.yaml); name it with "
            "--config"
        )
    # a run folder's config, its own or one named with --config: what lies beside that folder
    # came with it (trust.py); a --config in no run folder is a recipe of the user's
    with reading_config_of(run_folder_of(cfg_path)):
        return _export(source, load_config(cfg_path), Path(out))


def _export(source: Path, cfg, out: Path) -> dict:
    from paratrain.checkpoint import read_checkpoint
    from paratrain.tasks import get_task

    if out.exists() and any(out.iterdir()):
        raise UserError(f"export: {out} exists and is not empty; give a new folder")
    state = read_checkpoint(source)
    tensors = state["model"]
    out.mkdir(parents=True, exist_ok=True)
    if get_task(cfg.task).export_format == "huggingface":
        fmt = _hf_folder(cfg, tensors, out)
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, out / "model.safetensors")
        fmt = "safetensors"
    written = {
        "format": fmt,
        "files": sorted(p.name for p in out.iterdir()),
        "step": state["loop"]["step"],
        "source": str(source),
        "written_by": {"world_size": state["world_size"], **state.get("layout", {})},
    }
    (out / "export.json").write_text(json.dumps(written, indent=1) + "\n")
    return written


def _hf_folder(cfg, tensors: dict[str, torch.Tensor], out: Path) -> str:
    """The run's model rebuilt in one process (its shape or weights from model.path, LoRA as the
    run applied it), the checkpoint's tensors put in, saved by transformers / peft."""
    from paratrain.data.text.tokenizer import load_tokenizer
    from paratrain.models.causal_lm.build import build_causal_lm
    from paratrain.models.causal_lm.lora import apply_lora

    m = cfg.model
    dtype = next(iter(tensors.values())).dtype
    model = build_causal_lm(m.path, m.init, m.shape, m.attn_implementation, dtype, "cpu", m.layers)
    model = apply_lora(model, cfg.lora)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    # a LoRA checkpoint holds what trains (the base comes from model.path); tied weights load
    # through the tensor they share
    missing = [k for k in missing if k not in frozen and not _tied(model, k)]
    if missing or unexpected:
        names = (missing or unexpected)[:3]
        raise UserError(
            f"export: the checkpoint does not fit the run's model ({len(missing)} tensors "
            f"missing, {len(unexpected)} extra: {', '.join(names)})"
        )
    model.save_pretrained(out)
    load_tokenizer(m.path, m.tokenizer).save_pretrained(out)
    return "peft-adapter" if cfg.lora.enabled else "hf-model"


def _tied(model, key: str) -> bool:
    return key.endswith("lm_head.weight") and bool(
        getattr(model.config, "tie_word_embeddings", False)
    )
