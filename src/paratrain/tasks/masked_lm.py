"""Masked-language-model training (BERT, seed 001's case study): plain text as [CLS] piece [SEP]
rows, 15% of each row corrupted (data/text/masking.py, keyed by seed, epoch and sample), the loss on
the corrupted positions; held-out masked-token loss, accuracy and perplexity; tokens/s, MFU."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from paratrain.config.data import PLAIN_TEXT
from paratrain.config.keys import LM_UNREAD, dotted
from paratrain.data.loader import OnDevice, loader_workers, rank_loaders
from paratrain.data.text import data as lmdata
from paratrain.data.text import encoder as enc
from paratrain.data.text.masking import IGNORE, mask_row, sample_generator
from paratrain.data.text.tokenizer import check_tokenizer
from paratrain.distributed import process_group as pg
from paratrain.errors import UserError
from paratrain.models.bert import BERT_SHAPES, SHAPES, BertSpec, bert_of
from paratrain.protocols import BuildContext, Layout, Task, Workload

SYNTHETIC_ROWS = 512  # random rows are all alike: a few hundred cycle as epochs
VAL_EPOCH = 0  # held-out rows keep one mask, so that evaluations compare


def check(cfg, layout: Layout) -> None:
    """Config-time checks of the BERT tasks (ValueError naming the field)."""
    m = cfg.model
    if m.path is None and m.shape not in BERT_SHAPES:
        raise ValueError(
            f"model.shape: a BERT task trains a BERT; set model.init=random with model.shape "
            f"{' or '.join(BERT_SHAPES)}, or model.path to a Hugging Face checkpoint"
        )
    if m.kernels != "none" or m.fp8 != "none" or m.loss_chunk_tokens:
        raise ValueError(
            "model.kernels: Liger kernels, fp8 and the chunked loss are built for causal LMs; "
            "set kernels=none, fp8=none, loss_chunk_tokens=0 for BERT"
        )
    if cfg.data.packing:
        raise ValueError("data.packing: BERT rows are one piece each; set data.packing=false")
    limit = SHAPES.get(m.shape, {}).get("max_position_embeddings", 512)
    if cfg.data.max_length > limit:
        raise ValueError(
            f"data.max_length: {cfg.data.max_length} exceeds BERT's {limit} positions; lower it"
        )


def preflight(cfg, layout: Layout, cuda: bool) -> None:
    if cfg.model.path is not None and not Path(cfg.model.path).is_dir():
        raise UserError(
            f"model.path: no such directory {cfg.model.path} (a Hugging Face checkpoint)"
        )
    check_tokenizer(cfg.model.path, cfg.model.tokenizer)  # before the workers load the weights
    if cfg.data.source == "text":  # a missing or unreadable file: one line, before any process
        lmdata.text_documents("text", cfg.data.path)


def rows(cfg, tokenizer) -> list[list[int]]:
    d = cfg.data
    if d.source == "synthetic-text":  # random bytes between [CLS] and [SEP], every row full
        g = torch.Generator().manual_seed(cfg.seed)
        body = torch.randint(0, 256, (SYNTHETIC_ROWS, d.max_length - 2), generator=g).tolist()
        return [[tokenizer.cls_token_id, *r, tokenizer.sep_token_id] for r in body]
    assert d.source in PLAIN_TEXT, d.source
    out = enc.encode_documents(lmdata.text_documents(d.source, d.path), tokenizer, d.max_length)
    return out[: d.limit_samples] if d.limit_samples is not None else out


def summarize(loss_sum: float, correct: float, tokens: float) -> dict[str, float]:
    mean = loss_sum / max(tokens, 1)
    return {
        "val_loss": mean,
        "val_accuracy": correct / max(tokens, 1),
        "val_perplexity": math.exp(min(mean, 50.0)),
    }


class MaskedLM:
    """One rank's masked-LM run: its BERT, its rows masked in the loader workers, and what the
    trainer calls (loss, evaluate), built once by `build` (the tasks' one shape, as gan.py's)."""

    def __init__(self, ctx: BuildContext):
        cfg, policy, device = ctx.cfg, ctx.policy, ctx.device
        d, m = cfg.data, cfg.model
        self.policy, self.device, self.non_blocking = policy, device, d.non_blocking
        self.data, self.model_cfg = d, m
        tokenizer = enc.encoder_tokenizer(m.path, m.tokenizer)
        self.model = bert_of(m, policy, device)
        vocab = self.model.config.vocab_size
        if len(tokenizer) > vocab:
            raise UserError(
                f"model.shape: the tokenizer has {len(tokenizer)} ids, the model {vocab} embeddings"
            )
        all_rows = rows(cfg, tokenizer)
        n_val = int(len(all_rows) * d.val_fraction) if d.source != "synthetic-text" else 0
        # every 1/val_fraction-th row held out: pieces of one document sit together
        step = max(1, round(1 / d.val_fraction)) if n_val else 0
        self.val_rows = all_rows[::step][:n_val] if n_val else []
        held = set(range(0, len(all_rows), step)[:n_val]) if n_val else set()
        self.train_rows = [r for i, r in enumerate(all_rows) if i not in held]
        ctx.one_batch_each(len(self.train_rows))
        specials = torch.tensor(sorted(set(tokenizer.all_special_ids)))
        mask = dict(seed=cfg.seed, mask_id=tokenizer.mask_token_id, vocab_size=len(tokenizer))
        # the epoch the training rows are masked for: shared memory, so that loader workers
        # (which mask, off the training process) read what the training process sets before
        # each epoch
        self.epoch = torch.zeros((), dtype=torch.int64).share_memory_()
        val = MaskedRows(self.val_rows, specials, epoch=torch.tensor(VAL_EPOCH), **mask)
        self.train, self.val, self.sampler = rank_loaders(
            MaskedRows(self.train_rows, specials, epoch=self.epoch, **mask),
            val if self.val_rows else None,
            d,
            sampler=ctx.layout.sampler,
            rank=ctx.dp_rank,
            world=ctx.dp_size,
            seed=cfg.seed,
            loader_batch=ctx.loader_batch,
            even_val=True,  # under FSDP every forward is a collective: the same count everywhere
            collate_fn=MaskedCollate(tokenizer.pad_token_id),
            num_workers=loader_workers(d.num_workers),
            pin_memory=d.pin_memory and device.type == "cuda",
        )

    def on_device(self, batch) -> dict:
        return {k: v.to(self.device, non_blocking=self.non_blocking) for k, v in batch.items()}

    def loss(self, model, batch):
        # tokens: every real token runs through the model (what MFU counts), not only the
        # 15% the loss is taken on
        out = model(**batch)
        return out.loss, batch["attention_mask"].sum()

    @torch.no_grad()
    def evaluate(self, model, loader) -> dict[str, float]:
        """Held-out loss, accuracy and perplexity over the masked tokens, summed over ranks."""
        model.eval()
        sums = torch.zeros(3, device=self.device, dtype=torch.float64)
        for batch in loader:
            labels = batch.pop("labels")
            with self.policy.autocast():
                logits = model(**batch).logits.float()
            picked = labels != IGNORE
            sums[0] += torch.nn.functional.cross_entropy(
                logits[picked], labels[picked], reduction="sum"
            ).double()
            sums[1] += (logits[picked].argmax(-1) == labels[picked]).sum()
            sums[2] += picked.sum()
        return summarize(*pg.all_reduce_sum(sums.tolist(), self.device))

    def workload(self) -> Workload:
        model, d, m = self.model, self.data, self.model_cfg
        seq_len = max(len(r) for r in self.train_rows)
        spec = BertSpec()
        return Workload(
            model=model,
            spec=spec,
            train=OnDevice(EpochFed(self.train, self.sampler, self.epoch), self.on_device),
            val=OnDevice(self.val, self.on_device) if self.val is not None else None,
            sampler=self.sampler,
            loss=self.loss,
            evaluate=self.evaluate,
            flops_per_token=spec.flops_per_token(model, seq_len, False),
            compile_units=spec.blocks(model),
            info={
                "data_real": d.source != "synthetic-text",
                "random_init": m.init == "random",
                "train_rows": len(self.train_rows),
                "val_rows": len(self.val_rows),
                "parameters": sum(p.numel() for p in model.parameters()),
            },
            rows={"train": len(self.train_rows), "val": len(self.val_rows)},
        )


def build(ctx: BuildContext) -> Workload:
    return MaskedLM(ctx).workload()


class MaskedRows(torch.utils.data.Dataset):
    """[CLS] piece [SEP] rows, each corrupted when read (in the loader workers) by the key
    (seed, epoch, its index): data/text/masking.py -> (corrupted ids, labels)."""

    def __init__(self, rows, specials, *, epoch: torch.Tensor, seed, mask_id, vocab_size):
        self.rows, self.specials, self.epoch = rows, specials, epoch
        self.seed, self.mask_id, self.vocab_size = seed, mask_id, vocab_size

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.tensor(self.rows[i])
        return mask_row(
            ids,
            ~torch.isin(ids, self.specials),
            mask_id=self.mask_id,
            vocab_size=self.vocab_size,
            generator=sample_generator(self.seed, int(self.epoch), i),
        )


class MaskedCollate:
    """Pads to the batch's longest row (ids with [PAD], labels with IGNORE) -> input_ids,
    attention_mask, labels."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, batch) -> dict[str, torch.Tensor]:
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (x, y) in enumerate(batch):
            ids[row, : len(x)], labels[row, : len(y)], attention[row, : len(x)] = x, y, 1
        return {"input_ids": ids, "attention_mask": attention, "labels": labels}


class EpochFed:
    """The training loader: before each epoch's first batch, the epoch its rows are masked for
    is set where the workers read it."""

    def __init__(self, loader, sampler, epoch: torch.Tensor):
        self.loader, self.sampler, self.epoch = loader, sampler, epoch

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        self.epoch.fill_(self.sampler.epoch)
        return iter(self.loader)


# BERT: no LoRA, Liger, float8 or packing
BERT_UNREAD = (
    "lora",
    "gan",
    *LM_UNREAD,
    *dotted("model", ("kernels", "fp8", "fp8_lm_head", "loss_chunk_tokens")),
    "data.packing",
)


def bert_imports(cfg) -> tuple[str, ...]:
    # `import transformers` alone is its lazy shell; the BERT classes, the tokenizer and
    # torchvision (when installed) come in with modeling_utils
    return ("transformers.modeling_utils", "transformers.tokenization_utils_fast")


TASK = Task(
    name="masked_lm",
    reads=(*PLAIN_TEXT, "synthetic-text"),
    layouts=frozenset({"single", "ddp", "fsdp"}),
    check=check,
    preflight=preflight,
    build=build,
    counts_tokens=True,
    model_keys="huggingface",
    describes="text with 15% of tokens masked -> masked-token loss, accuracy, perplexity",
    unread=BERT_UNREAD,
    imports=bert_imports,
    family=BertSpec.traits,
)
