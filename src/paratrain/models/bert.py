"""BERT (Devlin et al. 2019): Hugging Face's BertForMaskedLM / BertForSequenceClassification,
random-init from a named shape or loaded from model.path; BertSpec for the parallel layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from paratrain import trust
from paratrain.errors import UserError
from paratrain.models.hf_loading import from_config, one_bar
from paratrain.protocols import FamilyTraits

SHAPES = {
    # bert-base-uncased's architecture (110M parameters)
    "bert-base": dict(
        vocab_size=30522,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
    ),
    # CPU tests: the byte tokenizer's 260 ids rounded up to 264; no dropout, so that runs in
    # different layouts (one process, two) compute the same numbers
    "tiny-bert": dict(
        vocab_size=264,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=512,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    ),
}
BERT_SHAPES = tuple(SHAPES)

FLOPS_FORMULA = (
    "6N + 12*layers*hidden*seq_len; N = matmul weights (all parameters but the word, position "
    "and token-type tables; the masked-LM decoder's tied vocabulary x hidden matmul counted)"
)


def bert_of(m, policy, device, num_labels: int | None = None) -> nn.Module:
    """build_bert as the model.* settings (a ModelConfig) and the precision policy say."""
    return build_bert(
        path=m.path,
        init=m.init,
        shape=m.shape,
        attn=m.attn_implementation,
        dtype=policy.param_dtype,
        device=device,
        layers=m.layers,
        num_labels=num_labels,
    )


def build_bert(
    *,
    path: str | None,
    init: str,
    shape: str | None,
    attn: str,
    dtype: torch.dtype,
    device: torch.device,
    layers: int | None = None,
    num_labels: int | None = None,
) -> nn.Module:
    """num_labels None: the masked-LM model; else a sequence classifier with that many classes."""
    from transformers import (
        AutoConfig,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
        BertConfig,
    )

    auto = AutoModelForMaskedLM if num_labels is None else AutoModelForSequenceClassification
    extra = {} if num_labels is None else {"num_labels": num_labels}
    # a folder's own modules (auto_map) run only with --trust-code: said, never asked mid-run
    remote = {"trust_remote_code": trust.trusted()}
    if init == "random":
        if path is not None:
            try:
                config = AutoConfig.from_pretrained(path, **extra, **remote)
            except (OSError, ValueError) as e:
                raise trust.remote_code(e, "model.path", path) or UserError(
                    f"model.path: cannot read {path}'s config ({str(e).splitlines()[0][:200]})"
                ) from None
        else:
            config = BertConfig(**SHAPES[shape], **extra)
        if layers:
            config.num_hidden_layers = layers
        config._attn_implementation = attn
        model = from_config(auto, config, path, dtype=dtype, **remote)
        return model.to(device)
    if not Path(path).is_dir():
        raise UserError(f"model.path: no such directory {path} (a Hugging Face checkpoint)")
    try:
        with one_bar():
            model = auto.from_pretrained(
                path, dtype=dtype, attn_implementation=attn, **extra, **remote
            )
    except (OSError, ValueError) as e:
        raise trust.remote_code(e, "model.path", path) or UserError(
            f"model.path: cannot load {path} ({str(e).splitlines()[0][:200]})"
        ) from None
    return model.to(device)


def encoder(model: nn.Module) -> nn.Module:
    """The BertModel inside a head (bert for BERT; roberta, distilbert... for its relatives)."""
    return getattr(model, model.base_model_prefix)


class BertSpec:
    """Encoders of the BERT layout: the blocks are the encoder layers; no pipeline cut, split or
    tensor-parallel plan (yet)."""

    family = "bert"
    traits = FamilyTraits()
    flops_formula = FLOPS_FORMULA

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        return list(encoder(model).encoder.layer)

    def _refuse(self, *_: Any, **__: Any):
        raise UserError(
            "strategy: BERT trains with single, ddp-* or fsdp; tensor parallelism, pipeline "
            "stages and the split have no plan for encoders yet"
        )

    pipeline_units = make_stage = make_stages = split_units = tp_plan = _refuse

    def flops_per_token(self, model: nn.Module, seq_len: int, lora: bool) -> float:
        """Training FLOPs per token (FLOPS_FORMULA): 6N (PaLM, App. B) plus attention's score and
        value products, 12 * layers * hidden * seq_len. The lookups (word, position, token
        type) are no matmuls; the masked-LM decoder multiplies by the word table (tied) and
        lists that weight once, so its vocabulary x hidden is added back."""
        cfg = model.config
        tables = sum(
            p.numel()
            for n, p in encoder(model).embeddings.named_parameters()
            if n.endswith("_embeddings.weight")
        )
        n = sum(p.numel() for p in model.parameters()) - tables
        out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if out is not None and out.weight is encoder(model).embeddings.word_embeddings.weight:
            n += out.weight.numel()
        return 6 * n + 12 * cfg.num_hidden_layers * cfg.hidden_size * seq_len
