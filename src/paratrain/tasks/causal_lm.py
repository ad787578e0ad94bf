"""Causal-LM training (seed 000 §5): a Hugging Face model, LoRA adapters or every weight,
instruction data or random tokens; next-token loss, held-out loss and perplexity, tokens/s, MFU."""

from __future__ import annotations

import math
import types
from pathlib import Path

import torch

from paratrain.config.data import PLAIN_TEXT, TEXT_FORMATS, TEXT_SOURCES
from paratrain.config.keys import LM_UNREAD
from paratrain.data.loader import OnDevice, loader_workers, rank_loaders
from paratrain.data.text import data as lmdata
from paratrain.data.text.tokenizer import BYTE_SPECIALS, check_tokenizer
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.models.causal_lm.attention import use_own_masks
from paratrain.models.causal_lm.build import build_causal_lm, shape_of
from paratrain.models.causal_lm.family import decoder_of, family_of
from paratrain.models.causal_lm.fast_layers import (
    apply_fp8,
    apply_kernels,
    check_fp8,
    check_kernels,
)
from paratrain.models.causal_lm.fp8_delayed import DelayedFrozenFloat8Linear, delay_fp8
from paratrain.models.causal_lm.fp8_frozen import freeze_fp8
from paratrain.models.causal_lm.lora import apply_lora, lora_targets
from paratrain.models.causal_lm.loss import (
    ChunkedLossLM,
    float8_head,
    next_token_loss_sum,
    plain_head,
)
from paratrain.models.causal_lm.spec import (
    CausalLMSpec,
    base_model,
    check_parallel,
    check_positions,
)
from paratrain.protocols import BuildContext, Layout, PipelineHooks, Task, Workload, whole_tensor
from paratrain.tasks import lm_levers

SYNTHETIC_ROWS = 512  # random rows are all alike: a few hundred cycle as epochs (max_steps decides)


def check(cfg, layout: Layout) -> None:
    """Config-time checks of this task (ValueError naming the field)."""
    m = cfg.model
    check_lm_head_adapter(cfg)
    if m.fp8_lm_head and (m.loss_chunk_tokens or m.kernels != "none"):
        raise ValueError(
            "model.fp8_lm_head: the chunked loss and Liger's fused loss multiply by lm_head's "
            "weight themselves, in bf16; set loss_chunk_tokens=0 and kernels=none with it"
        )
    if cfg.lora.enabled and cfg.lora.fused is True and (m.fp8 != "none" or layout.tp_enabled):
        raise ValueError(
            "lora.fused: the adapter goes inside a plain bf16 / fp32 base layer's matmul, not "
            "float8's (model.fp8) or tensor-parallel ones; set lora.fused=false"
        )
    if layout.tp_enabled:
        for field, value, off in (
            ("model.kernels", m.kernels, "none"),
            ("model.fp8", m.fp8, "none"),
            ("model.loss_chunk_tokens", m.loss_chunk_tokens, 0),
        ):
            if value != off:
                raise ValueError(
                    f"{field}: {value} is not built for tensor-parallel (DTensor) weights yet; "
                    f"set {field.split('.')[1]}={off} with parallel.tp"
                )
        if cfg.lora.enabled and "lm_head" in cfg.lora.target_modules:
            raise ValueError("lora.target_modules: lm_head takes no adapter under parallel.tp")
    if m.fp8 == "delayed" and {"fsdp", "pp"} & layout.uses:
        raise ValueError(
            "model.fp8: delayed keeps an amax history in each whole layer, which FSDP's shards "
            "and pipeline stages do not have; set model.fp8=tensorwise with them"
        )
    if "pp" in layout.uses:
        if cfg.data.packing:
            raise ValueError(
                "data.packing: packed rows need a block-diagonal mask, which pipeline stages do "
                "not pass; set data.packing=false with parallel.pp"
            )
        if m.attn_implementation not in ("sdpa", "flash_attention_2"):
            raise ValueError(
                f"model.attn_implementation: pipeline stages rely on causal attention without a "
                f"mask (sdpa, flash_attention_2), got {m.attn_implementation}"
            )
        if m.loss_chunk_tokens or m.kernels != "none":
            raise ValueError(
                "model.loss_chunk_tokens: a pipeline's last stage computes the loss itself; set "
                "loss_chunk_tokens=0 and kernels=none with parallel.pp"
            )


# GPT-2's config field names as transformers' attribute_map answers them under Llama's names
GPT2_NAMES = {
    "n_head": "num_attention_heads",
    "n_layer": "num_hidden_layers",
    "n_embd": "hidden_size",
    "n_inner": "intermediate_size",
    "n_positions": "max_position_embeddings",
}


def model_config(cfg):
    """The model's shape for the degree checks before launch: a named SHAPES entry as a dict
    under Llama's field names (without importing transformers, whose configs pull in
    torchvision: 3 s of every command's start), or the checkpoint's config.json."""
    if cfg.model.path is None:
        fields = shape_of(cfg.model.shape, cfg.model.layers)
        return {GPT2_NAMES.get(k, k): v for k, v in fields.items()}
    from transformers import AutoConfig

    from paratrain import trust

    path = cfg.model.path
    try:
        # a folder's own config code (auto_map) runs only with --trust-code, never asked
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust.trusted())
    except (OSError, ValueError) as e:
        raise trust.remote_code(e, "model.path", path) or UserError(
            f"model.path: cannot read {path}'s config ({str(e).splitlines()[0][:200]})"
        ) from None
    if cfg.model.layers:
        config.num_hidden_layers = cfg.model.layers
    return config


def check_lm_head_adapter(cfg) -> None:
    """The chunked loss and the Triton loss multiply by lm_head's weight themselves: an adapter
    on lm_head would be left out."""
    m = cfg.model
    if "lm_head" not in cfg.lora.target_modules:
        return
    if m.loss_chunk_tokens:
        raise ValueError(
            "model.loss_chunk_tokens: the chunked loss uses lm_head's weight directly; "
            "drop lm_head from lora.target_modules or set loss_chunk_tokens=0"
        )
    if m.kernels == "triton-loss" and cfg.lora.enabled:
        raise ValueError(
            "model.kernels: triton-loss uses lm_head's weight directly; drop lm_head from "
            "lora.target_modules or set kernels=none"
        )


def preflight(cfg, layout: Layout, cuda: bool) -> None:
    check_kernels(cfg.model.kernels, "cuda" if cuda else "cpu")
    check_fp8(cfg.model.fp8, "cuda" if cuda else "cpu")
    if cfg.data.source in TEXT_FORMATS:
        lmdata.check_path(cfg.data.path)
    if cfg.data.source == "text":  # a missing or unreadable file: one line, before any process
        lmdata.text_documents("text", cfg.data.path)
    if cfg.model.path is not None and not Path(cfg.model.path).is_dir():
        raise UserError(
            f"model.path: no such directory {cfg.model.path} (a Hugging Face checkpoint)"
        )
    # the model folder's tokenizer before the workers start and load the weights
    check_tokenizer(cfg.model.path, cfg.model.tokenizer)
    shape = model_config(cfg)
    check_parallel(shape, tp=layout.tp, pp=layout.pp, per_rank=layout.stages_per_rank)
    check_byte_ids(cfg, shape)
    check_positions(shape, cfg.data.max_length)
    d = cfg.data
    if d.packing or layout.pp > 1:  # rows are exactly max_length wide
        need = {
            "model.fp8 (float8 matmuls)": 16 if cfg.model.fp8 != "none" else 1,
            "sequence parallelism (parallel.tp)": layout.tp
            if cfg.parallel.sequence_parallel
            else 1,
        }
        for why, multiple in need.items():
            if d.max_length % multiple:
                raise UserError(
                    f"data.max_length: {d.max_length} is not a multiple of {multiple}, which "
                    f"{why} needs with {'data.packing' if d.packing else 'parallel.pp'}"
                )


def check_byte_ids(cfg, shape) -> None:
    """model.tokenizer=bytes: the byte tokenizer's ids are embedding rows of the model."""
    vocab = shape["vocab_size"] if isinstance(shape, dict) else shape.vocab_size
    ids = 256 + len(BYTE_SPECIALS)
    if cfg.model.tokenizer == "bytes" and vocab < ids:
        raise UserError(
            f"model.tokenizer: bytes needs {ids} ids, the model at {cfg.model.path} has a "
            f"vocabulary of {vocab}"
        )


def _examples(cfg, tokenizer, vocab: int, is_main: bool = True):
    d = cfg.data
    if d.source == "synthetic-text":
        return lmdata.synthetic_examples(
            SYNTHETIC_ROWS, d.max_length, min(vocab, len(tokenizer)), cfg.seed
        )
    if d.source in PLAIN_TEXT:
        docs = lmdata.text_documents(d.source, d.path)
        rows = lmdata.text_examples(docs, tokenizer, d.max_length)
        return rows[: d.limit_samples] if d.limit_samples is not None else rows
    records = lmdata.read_records(d.path, d.split)
    if d.limit_samples is not None:
        records = records[: d.limit_samples]
    examples = lmdata.tokenize(
        records,
        d.source,
        tokenizer,
        max_length=d.max_length,
        truncation=d.truncation,
        where=f"data.path {d.path}",
    )
    # Truncation can cut an example's whole response (its only trained tokens): such a row
    # trains nothing, and a batch of them has a loss of 0/0. Left out, and counted.
    kept = [e for e in examples if any(label != lmdata.IGNORE for label in e[1])]
    if not kept:
        raise UserError(
            f"data.max_length: after truncation to {d.max_length} tokens no example of "
            f"{d.path} keeps a trained token (the responses come after the prompt); raise "
            "data.max_length"
        )
    if len(kept) < len(examples) and is_main:
        print(
            f"paratrain: {len(examples) - len(kept)} of {len(examples)} examples left out: "
            f"truncation to data.max_length={d.max_length} cut their whole response",
            flush=True,
        )
    return kept


def trained_tokens(labels: torch.Tensor) -> torch.Tensor:
    """Positions the loss is averaged over (labels shift by one; -100 is not trained)."""
    return (labels[:, 1:] != lmdata.IGNORE).sum()


def score(logits: torch.Tensor, labels: torch.Tensor) -> dict:
    return {"loss_sum": next_token_loss_sum(logits, labels), "tokens": trained_tokens(labels)}


def summarize(sums: dict[str, float]) -> dict[str, float]:
    mean = sums["loss_sum"] / max(sums["tokens"], 1)
    return {"val_loss": mean, "val_perplexity": float(torch.exp(torch.tensor(min(mean, 50.0))))}


class CausalLM:
    """One rank's causal-LM run: its model (kernels, float8, LoRA, the loss wrapper), its token
    rows as loaders, and what the trainer calls (loss, evaluate, finish), built once by
    `build` (the tasks' one shape, as gan.py's Gan)."""

    def __init__(self, ctx: BuildContext):
        self.ctx, self.cfg = ctx, ctx.cfg
        self.model, self.tokenizer = build_model(ctx)
        self.train_rows, self.val_rows = token_rows(
            ctx, self.tokenizer, self.model.config.vocab_size
        )
        self.train, self.val, self.sampler = loaders(
            ctx, self.tokenizer, self.train_rows, self.val_rows
        )
        self.evaluate = evaluator(ctx)

    def loss(self, model, batch):
        return loss(model, batch)  # the module's: the bench's peers share it

    def finish(self, model, out_dir: Path) -> dict[str, str]:
        """The LoRA adapter (and the merged model where asked) beside the run's files."""
        from paratrain.models.causal_lm.saving import save_adapter

        return save_adapter(
            model,
            out_dir,
            self.tokenizer,
            merged=self.cfg.lora.save_merged,
            is_main=self.ctx.is_main,
            pipelined=self.ctx.layout.pp > 1,
        )

    def workload(self) -> Workload:
        cfg, layout, model = self.cfg, self.ctx.layout, self.model
        d = cfg.data
        spec = CausalLMSpec()
        seq_len = (
            d.max_length
            if d.packing or d.source == "synthetic-text" or layout.pp > 1
            else max(len(r[0]) for r in self.train_rows)
        )
        return Workload(
            model=model,
            spec=spec,
            train=self.train,
            val=self.val,
            sampler=self.sampler,
            loss=self.loss,
            evaluate=self.evaluate,
            pipeline=PIPELINE,
            flops_per_token=spec.flops_per_token(model, seq_len, cfg.lora.enabled),
            floor=spec.step_work(model, d.batch_size, seq_len) if cfg.train.floor else None,
            finish=self.finish if cfg.lora.enabled else None,
            compile_units=compile_units(model, spec, cfg.train.compile_scope, layout.tp_enabled),
            info=facts(self.ctx, model, self.train_rows),
            rows={"train": len(self.train_rows), "val": len(self.val_rows)},
        )


def build(ctx: BuildContext) -> Workload:
    return CausalLM(ctx).workload()


def build_model(ctx: BuildContext):
    """-> (the model as it trains: kernels, float8, LoRA, the loss wrapper; its tokenizer)."""
    from paratrain.data.text.tokenizer import load_tokenizer

    cfg, policy, device, m = ctx.cfg, ctx.policy, ctx.device, ctx.cfg.model
    # Frozen base weights live in the autocast dtype (half the memory); trainable ones in fp32.
    frozen_low = cfg.lora.enabled and policy.autocast_dtype
    base_dtype = policy.autocast_dtype if frozen_low else policy.param_dtype
    model = build_causal_lm(
        m.path, m.init, m.shape, m.attn_implementation, base_dtype, device, m.layers
    )
    # the KV cache is for generation; training only wastes memory on it
    model.config.use_cache = False
    if m.attn_implementation == "sdpa":  # the masks from the host's knowledge: no host sync
        use_own_masks(model, decoder_of(model))
    model = apply_kernels(model, m.kernels, device)
    model = apply_fp8(model, m.fp8, device, lm_head=m.fp8_lm_head)
    model = apply_lora(model, cfg.lora).to(device)
    if cfg.lora.enabled and cfg.lora.fused is True:
        fuse_lora(model)
    if m.fp8 != "none" and cfg.lora.enabled and not {"fsdp", "tp", "pp"} & ctx.layout.uses:
        # the frozen base weights in float8 once, not each step (fp8_frozen.py); where ranks
        # hold shards, the shards' all-gather decides what is cast, and a pipeline rank would
        # cast every layer before its stage is cut out: torchao's layers stay there
        delayed = DelayedFrozenFloat8Linear if m.fp8 == "delayed" else None
        model = freeze_fp8(model, delayed)
    if m.fp8 == "delayed":  # trained layers' casts scaled from their amax history
        model = delay_fp8(model)
    # else the model's own loss
    compiled_loss = cfg.train.compile and (plain_head(model) or float8_head(model))
    if m.loss_chunk_tokens or m.kernels != "none" or ctx.layout.tp_enabled or compiled_loss:
        # under TP the wrapper computes lm_head + loss itself: from vocabulary-sharded logits;
        # compiled, lm_head + loss are a compile unit of their own (loss.WholeLoss)
        fused = "none" if m.loss_chunk_tokens else m.kernels
        model = ChunkedLossLM(model, m.loss_chunk_tokens, fused=fused)
    return model, load_tokenizer(m.path, m.tokenizer)


def fuse_lora(model) -> None:
    """lora.fused: peft's linear LoRA layers that fit take the fused forward, the others keep
    peft's (lora_matmul.fits; an embedding's adapter is peft's own); LoRA linear layers of which
    none fits are refused in one line (the plan said fused; auto leaves out what it knows does
    not fit: dropout, float8, Conv1D, quantized checkpoints)."""
    from paratrain.models.causal_lm.lora_matmul import fuse_adapters

    patched, kept = fuse_adapters(model)
    if kept and not patched:
        raise UserError(f"lora.fused: {kept[0]}; set lora.fused=false")


def footprint(cfg) -> dict[str, int] | None:
    """The model's parameters (trainable: LoRA's adapters where it trains them) and one row's
    saved activations at data.max_length with transformers' own loss (Task.footprint), counted
    without data (models/footprint.py): the shape's or model.path's config.json, no weights
    read."""
    from paratrain.models.footprint import counted

    m, rows = cfg.model, cfg.data.max_length

    def build():
        model = build_causal_lm(m.path, "random", m.shape, "sdpa", torch.float32, "meta", m.layers)
        model.config.use_cache = False
        use_own_masks(model, decoder_of(model))  # transformers' masks read values: fakes have none
        return apply_lora(model, cfg.lora) if cfg.lora.enabled else model

    def step(model):
        ids = torch.zeros(1, rows, dtype=torch.long)
        return model(input_ids=ids, labels=ids).loss

    from transformers.utils import logging as hf_logging

    # the count is the launching command's, before the plan's lines: transformers' notes on
    # the config it builds (its loss_type) are not the user's to read here
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return counted(build, step, input_bytes=2 * rows * 8)  # the row and its labels
    finally:
        hf_logging.set_verbosity(level)


def token_rows(ctx: BuildContext, tokenizer, vocab: int) -> tuple[list, list]:
    """-> (training rows, held-out rows): examples, packed into max_length rows if asked."""
    d, m = ctx.cfg.data, ctx.cfg.model
    examples = _examples(ctx.cfg, tokenizer, vocab, ctx.is_main)
    n_val = int(len(examples) * d.val_fraction) if d.source != "synthetic-text" else 0
    val_rows, train_rows = examples[:n_val], examples[n_val:]
    if d.packing and m.fp8 != "none" and d.max_length % 16:
        raise UserError(  # packed rows are max_length wide; float8 matmuls need multiples of 16
            f"data.max_length: {d.max_length} is not a multiple of 16, which model.fp8 needs "
            "with data.packing"
        )
    if d.packing:
        train_rows = lmdata.pack(train_rows, d.max_length, tokenizer.pad_token_id)
        val_rows = lmdata.pack(val_rows, d.max_length, tokenizer.pad_token_id)
    ctx.one_batch_each(len(train_rows))
    return train_rows, val_rows


def loaders(ctx: BuildContext, tokenizer, train_rows: list, val_rows: list):
    """-> (training batches on the device, held-out batches or None, the epoch sampler)."""
    d, m, layout, device = ctx.cfg.data, ctx.cfg.model, ctx.layout, ctx.device
    # Row widths: float8 matmuls need multiples of 16; sequence parallelism splits the sequence
    # over the tp ranks; a pipeline's stages exchange fixed-size activations, so its rows are
    # max_length wide.
    multiple = 16 if m.fp8 != "none" else 1
    if layout.tp_enabled and ctx.cfg.parallel.sequence_parallel:
        multiple = math.lcm(multiple, layout.tp)
    width = d.max_length if layout.pp > 1 else None
    train, val, sampler = rank_loaders(
        lmdata.TokenRows(train_rows),
        lmdata.TokenRows(val_rows) if val_rows else None,
        d,
        sampler=layout.sampler,
        rank=ctx.dp_rank,
        world=ctx.dp_size,
        seed=ctx.cfg.seed,
        loader_batch=ctx.loader_batch,
        even_val=True,  # under FSDP every forward is a collective: the same count everywhere
        collate_fn=lmdata.Collate(tokenizer.pad_token_id, d.packing, multiple, width=width),
        num_workers=loader_workers(d.num_workers),
        pin_memory=d.pin_memory and device.type == "cuda",
        persistent_workers=d.persistent_workers,
        prefetch_factor=d.prefetch_factor,
    )

    def on_device(loader):
        return OnDevice(
            loader,
            lambda batch: {k: v.to(device, non_blocking=d.non_blocking) for k, v in batch.items()},
        )

    return on_device(train), on_device(val) if val is not None else None, sampler


def loss(model, batch):
    """-> (the batch's mean next-token loss, the tokens it trained on)."""
    tokens = batch["num_tokens"]
    inputs = {k: v for k, v in batch.items() if k != "num_tokens"}
    return model(**inputs).loss, tokens


def evaluator(ctx: BuildContext):
    device, policy = ctx.device, ctx.policy

    @torch.no_grad()
    def evaluate(model, loader) -> dict[str, float]:
        """Token-weighted held-out loss (and perplexity), summed over ranks."""
        model.eval()
        total = torch.zeros((), device=device, dtype=torch.float64)
        count = torch.zeros((), device=device, dtype=torch.float64)
        for batch in loader:
            n = trained_tokens(batch["labels"])
            with policy.autocast():
                out = model(**{k: v for k, v in batch.items() if k != "num_tokens"})
                total += whole_tensor(out.loss).double().to(total.device) * n  # split: last GPU
            count += n
        s, c = pg.all_reduce_sum([total.item(), count.item()], device)
        return summarize({"loss_sum": s, "tokens": c})

    return evaluate


PIPELINE = PipelineHooks(
    split=lambda b: (b["input_ids"], b["labels"], trained_tokens(b["labels"])),
    loss_sum=next_token_loss_sum,
    score=score,
    summarize=summarize,
    score_keys=("loss_sum", "tokens"),
    tokens=lambda b: b["num_tokens"],
)


def compile_units(model, spec, scope: str, tp_enabled: bool) -> list:
    """What train.compile compiles in place (parallel/apply.py): each decoder layer and the final
    norm (eager, the norm's fp32 upcast, reduction and casts were ten kernels a step), or the
    whole decoder as one graph; and the loss where it is a unit of its own. Under TP the norm
    works on sequence shards (DTensors) and stays eager, as torchtitan leaves it."""
    decoder = decoder_of(base_model(model))
    if scope == "decoder":
        rotary = getattr(decoder, "rotary_emb", None)  # Llama's layout; GPT-2 has none
        if rotary is not None and "forward" not in vars(rotary):
            # eager: in one graph inductor folds the cos / sin computation into every layer's
            # rotary kernels and recomputes it there (5.4 ms a step against 1.5 on the 1B
            # shape, one H200); eager, the layers read one stored pair. Bound to the module
            # itself, so a deepcopy rebinds to the copy and the model still pickles.
            eager = torch.compiler.disable(type(rotary).forward)
            rotary.forward = types.MethodType(eager, rotary)
        return [decoder, *loss_units(model, tp_enabled)]
    norm = [] if tp_enabled else [getattr(decoder, family_of(model).norm)]
    return [*spec.blocks(model), *norm, *loss_units(model, tp_enabled)]


def loss_units(model, tp_enabled: bool) -> list:
    """The chunked / whole loss as a compile unit of its own (not under TP's sharded loss)."""
    if isinstance(model, ChunkedLossLM) and model.fused == "none" and not tp_enabled:
        return [model.chunk_loss if model.chunk else model.whole_loss]
    return []


def facts(ctx: BuildContext, model, train_rows: list) -> dict:
    """What result.json records of the workload."""
    d, m, lora = ctx.cfg.data, ctx.cfg.model, ctx.cfg.lora
    return {
        "data_real": d.source != "synthetic-text",
        "random_init": m.init == "random",
        "kernels": m.kernels,
        "fp8": m.fp8,
        "fp8_lm_head": m.fp8_lm_head,
        "pin_memory": d.pin_memory and ctx.device.type == "cuda",
        "train_rows": len(train_rows),
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "lora_targets": lora_targets(model, lora) if lora.enabled else None,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


TASK = Task(
    name="causal_lm",
    reads=TEXT_SOURCES,
    layouts=frozenset({"single", "ddp", "fsdp", "tp", "pp", "split"}),
    check=check,
    preflight=preflight,
    build=build,
    counts_tokens=True,
    model_keys="huggingface",
    describes="tokens -> next-token loss, held-out loss and perplexity",
    levers=lm_levers.levers,
    unread=("gan", *LM_UNREAD),
    lora=True,
    family=CausalLMSpec.traits,
    export_format="huggingface",
    # peft imports transformers' models and the Llama classes
    imports=lambda cfg: ("transformers", "peft"),
    footprint=footprint,
)
