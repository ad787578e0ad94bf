"""Causal-LM fine-tuning (seed 000 §5): an HF model, LoRA adapters, instruction data."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader

from paratrain import dist as pdist
from paratrain.data.samplers import EpochSampler, RoundRobinSampler, build_sampler
from paratrain.errors import UserError
from paratrain.lm import data as lmdata
from paratrain.lm.loss import ChunkedLossLM
from paratrain.lm.model import (
    apply_fp8,
    apply_kernels,
    apply_lora,
    build_causal_lm,
    decoder_layers,
    flops_per_token,
)
from paratrain.lm.tokenizer import load_tokenizer
from paratrain.tasks import Workload

SYNTHETIC_ROWS = 512  # random rows are all alike: a few hundred cycle as epochs (max_steps decides)


def _examples(cfg, tokenizer, vocab: int):
    d = cfg.data
    if d.source == "synthetic-text":
        return lmdata.synthetic_examples(
            SYNTHETIC_ROWS, d.max_length, min(vocab, len(tokenizer)), cfg.seed
        )
    records = lmdata.read_records(d.path, d.split)
    if d.limit_samples is not None:
        records = records[: d.limit_samples]
    return lmdata.tokenize(
        records,
        d.source,
        tokenizer,
        max_length=d.max_length,
        truncation=d.truncation,
        where=f"data.path {d.path}",
    )


def build(cfg, env: pdist.DistEnv, sampler_mode: str, policy, loader_batch: int) -> Workload:
    d, m = cfg.data, cfg.model
    tokenizer = load_tokenizer(m.path)
    # Frozen base weights live in the autocast dtype (half the memory); trainable ones in fp32.
    base_dtype = (
        policy.autocast_dtype
        if (cfg.lora.enabled and policy.autocast_dtype)
        else policy.param_dtype
    )
    model = build_causal_lm(m.path, m.init, m.shape, m.attn_implementation, base_dtype, env.device)
    model.config.use_cache = (
        False  # the KV cache is for generation; training only wastes memory on it
    )
    model = apply_kernels(model, m.kernels, env.device)
    model = apply_fp8(model, m.fp8, env.device)
    model = apply_lora(model, cfg.lora).to(env.device)
    if m.loss_chunk_tokens or m.kernels != "none":
        fused = "none" if m.loss_chunk_tokens else m.kernels
        model = ChunkedLossLM(model, m.loss_chunk_tokens, fused=fused)

    examples = _examples(cfg, tokenizer, model.config.vocab_size)
    n_val = int(len(examples) * d.val_fraction) if d.source != "synthetic-text" else 0
    val_ex, train_ex = examples[:n_val], examples[n_val:]
    if d.packing and m.fp8 != "none" and d.max_length % 16:
        raise UserError(  # packed rows are max_length wide; float8 matmuls need multiples of 16
            f"data.max_length: {d.max_length} is not a multiple of 16, which model.fp8 needs "
            "with data.packing"
        )
    if d.packing:
        train_rows = lmdata.pack(train_ex, d.max_length, tokenizer.pad_token_id)
        val_rows = lmdata.pack(val_ex, d.max_length, tokenizer.pad_token_id)
    else:
        train_rows, val_rows = train_ex, val_ex
    needed = loader_batch * (env.world_size if sampler_mode != "full" else 1)
    if len(train_rows) < needed:
        raise UserError(
            f"data.batch_size: {len(train_rows)} training rows are fewer than one batch on every "
            f"rank ({loader_batch} x {env.world_size})"
        )
    collate = lmdata.Collate(tokenizer.pad_token_id, d.packing, 16 if m.fp8 != "none" else 1)
    pin = d.pin_memory and env.device.type == "cuda"
    sampler = EpochSampler(
        build_sampler(
            sampler_mode,
            len(train_rows),
            rank=env.rank,
            world=env.world_size,
            shuffle=d.shuffle,
            seed=cfg.seed,
        )
    )
    common = dict(
        collate_fn=collate,
        num_workers=d.num_workers,
        pin_memory=pin,
        persistent_workers=d.persistent_workers,
        prefetch_factor=d.prefetch_factor,
    )
    train = DataLoader(
        lmdata.TokenRows(train_rows),
        batch_size=loader_batch,
        sampler=sampler,
        drop_last=True,
        generator=torch.Generator().manual_seed(cfg.seed + env.rank),
        **common,
    )
    val = None
    if val_rows:
        # even: under FSDP every forward is a collective, so every rank must run the same count.
        val_sampler = RoundRobinSampler(
            len(val_rows), env.world_size, env.rank, shuffle=False, even=True
        )
        val = DataLoader(
            lmdata.TokenRows(val_rows), batch_size=loader_batch, sampler=val_sampler, **common
        )

    def on_device(loader):
        class Moved:
            def __len__(self):
                return len(loader)

            def __iter__(self):
                for batch in loader:
                    yield {
                        k: v.to(env.device, non_blocking=d.non_blocking) for k, v in batch.items()
                    }

        return Moved()

    def loss(model, batch):
        tokens = batch["num_tokens"]
        inputs = {k: v for k, v in batch.items() if k != "num_tokens"}
        return model(**inputs).loss, tokens

    @torch.no_grad()
    def evaluate(model, loader) -> dict[str, float]:
        """Token-weighted held-out loss (and perplexity), summed over ranks."""
        model.eval()
        total = torch.zeros((), device=env.device, dtype=torch.float64)
        count = torch.zeros((), device=env.device, dtype=torch.float64)
        for batch in loader:
            n = (batch["labels"][:, 1:] != lmdata.IGNORE).sum()  # labels the loss is averaged over
            with policy.autocast():
                total += (
                    model(**{k: v for k, v in batch.items() if k != "num_tokens"}).loss.double() * n
                )
            count += n
        s, c = pdist.all_reduce_sum([total.item(), count.item()], env.device)
        mean = s / max(c, 1)
        return {"val_loss": mean, "val_perplexity": float(torch.exp(torch.tensor(min(mean, 50.0))))}

    def finish(model, out_dir: Path) -> dict[str, str]:
        from paratrain.lm.save import save_adapter

        return save_adapter(
            model, out_dir, tokenizer, merged=cfg.lora.save_merged, is_main=env.is_main
        )

    seq_len = (
        d.max_length
        if d.packing or d.source == "synthetic-text"
        else max(len(r[0]) for r in train_rows)
    )
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return Workload(
        model=model,
        train=on_device(train),
        val=on_device(val) if val is not None else None,
        sampler=sampler,
        loss=loss,
        evaluate=evaluate,
        flops_per_token=flops_per_token(model, seq_len, cfg.lora.enabled),
        finish=finish if cfg.lora.enabled else None,
        blocks=decoder_layers(model)
        + (
            [model.chunk_loss] if isinstance(model, ChunkedLossLM) and model.fused == "none" else []
        ),
        info={
            "data_real": d.source != "synthetic-text",
            "random_init": m.init == "random",
            "kernels": m.kernels,
            "fp8": m.fp8,
            "pin_memory": pin,
            "train_rows": len(train_rows),
            "trainable_parameters": trainable,
            "parameters": sum(p.numel() for p in model.parameters()),
        },
    )
