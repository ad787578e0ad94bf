"""Building a causal LM through HF transformers: from a checkpoint directory, or a named Llama or
GPT-2 shape with random weights (throughput work, tests; no weights needed)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from paratrain import trust
from paratrain.errors import UserError
from paratrain.models.causal_lm.family import family_of
from paratrain.models.hf_loading import from_config, one_bar

# Llama shapes for random-init throughput work (no weights needed). From the models' config.json.
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
    "llama3.2-1b": dict(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    ),
    # A few hundred thousand parameters: CPU tests. Its vocabulary holds the byte tokenizer's 259.
    "tiny": dict(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rope_theta=500000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    ),
    # GPT-2 small (124M) as openai-community/gpt2's config.json: lm_head tied to wte. Dropout 0,
    # as nanoGPT pretrains it (and so that ranks and replays compute the same).
    "gpt2": dict(
        model_type="gpt2",
        vocab_size=50257,
        n_positions=1024,
        n_embd=768,
        n_layer=12,
        n_head=12,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    ),
    # CPU tests: the byte tokenizer's 259 ids fit in 320 (its begin / end of text are 256 / 257,
    # GPT-2's 50256 would lie outside); rows up to 512 tokens.
    "tiny-gpt2": dict(
        model_type="gpt2",
        vocab_size=320,
        bos_token_id=256,
        eos_token_id=257,
        n_positions=512,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
    ),
}
SHAPE_FAMILIES = {"llama", "gpt2"}  # the families SHAPES names (their classes: Family.hf_classes)

# Config-only shapes: what the forecast prices (forecast/shapes.py), not offered as model.shape
# (config/model.py): their random weights fit no one machine. Llama 3.1 as meta-llama's
# config.json files have them; 3.1 8B has Llama 3 8B's widths (3.1 lengthens the context only).
SHAPES["llama3.1-8b"] = {**SHAPES["llama3-8b"], "max_position_embeddings": 131072}
SHAPES["llama3.1-70b"] = dict(
    vocab_size=128256,
    hidden_size=8192,
    intermediate_size=28672,
    num_hidden_layers=80,
    num_attention_heads=64,
    num_key_value_heads=8,
    tie_word_embeddings=False,
)
SHAPES["llama3.1-405b"] = dict(
    vocab_size=128256,
    hidden_size=16384,
    intermediate_size=53248,
    num_hidden_layers=126,
    num_attention_heads=128,
    num_key_value_heads=8,
    tie_word_embeddings=False,
)

# Llama 2 as meta-llama's config.json files have them (the 34B: the Llama 2 paper's, GQA with 8
# key-value heads, as Code Llama 34B shipped it); published FSDP rows train them
for _size, (_h, _f, _l, _heads, _kv) in {
    "7b": (4096, 11008, 32, 32, 32),
    "13b": (5120, 13824, 40, 40, 40),
    "34b": (8192, 22016, 48, 64, 8),
    "70b": (8192, 28672, 80, 64, 8),
}.items():
    SHAPES[f"llama2-{_size}"] = dict(
        vocab_size=32000, tie_word_embeddings=False, hidden_size=_h, intermediate_size=_f,
        num_hidden_layers=_l, num_attention_heads=_heads, num_key_value_heads=_kv,
    )  # fmt: skip


def build_causal_lm(
    path: str | None,
    init: str,
    shape: str | None,
    attn: str,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    layers: int | None = None,
) -> nn.Module:
    """Random init builds straight on `device` in `dtype` (an 8B model in fp32 on the host would be
    32 GB and minutes of single-threaded init); pretrained weights load on the host."""
    from transformers import AutoConfig, AutoModelForCausalLM

    # a folder's own modules (auto_map) run only with --trust-code: said, never asked mid-run
    remote = {"trust_remote_code": trust.trusted()}
    if init == "random":
        if path is not None:
            try:
                config = AutoConfig.from_pretrained(path, **remote)
            except (OSError, ValueError) as e:
                raise trust.remote_code(e, "model.path", path) or UserError(
                    f"model.path: cannot read {path}'s config ({str(e).splitlines()[0][:200]})"
                ) from None
            config._attn_implementation = attn
            if layers:
                config.num_hidden_layers = layers  # GPT-2's n_layer through its alias
            with building(dtype, device):
                return from_config(AutoModelForCausalLM, config, path, dtype=dtype, **remote)
        config = shape_config(shape, layers, attn)
        with building(dtype, device):
            return model_class(config)(config)
    if not Path(path).is_dir():
        raise UserError(f"model.path: no such directory {path} (a Hugging Face checkpoint)")
    try:
        with one_bar():
            return AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, attn_implementation=attn, **remote
            )
    except (OSError, ValueError) as e:
        raise trust.remote_code(e, "model.path", path) or UserError(
            f"model.path: cannot load {path} ({str(e).splitlines()[0][:200]})"
        ) from None


def shape_of(shape: str, layers: int | None = None) -> dict:
    """A named shape's config fields, with its decoder layer count replaced when given."""
    key = family_of(SHAPES[shape]).layers_key
    return {**SHAPES[shape], **({key: layers} if layers else {})}


def shape_config(shape: str, layers: int | None = None, attn: str = "sdpa"):
    """A named shape as its transformers config (its family's: LlamaConfig, GPT2Config)."""
    import transformers

    fields = shape_of(shape, layers)
    config_class = getattr(transformers, family_of(fields).hf_classes[0])
    fields.pop("model_type", None)
    return config_class(**fields, attn_implementation=attn)


def model_class(config):
    """The causal-LM class of a shape's config. The class itself, not AutoModelForCausalLM's
    from_config: the same seed gives the same weights as the plain reference (bench/peers)."""
    import transformers

    family = family_of(config)
    if family.family not in SHAPE_FAMILIES:  # a named shape is built from its family's classes
        raise UserError(f"model.shape: no causal-LM class for model_type {family.family!r}")
    return getattr(transformers, family.hf_classes[1])


@contextlib.contextmanager
def building(dtype: torch.dtype, device: torch.device | str):
    """New tensors in `dtype` on `device` (torch's default-dtype and device context)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(old)


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks (under a peft wrapper too): the unit of FSDP sharding."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    family = family_of(inner)
    layers = getattr(getattr(inner, family.decoder, None), family.layers, None)
    if layers is None:
        raise UserError(
            "model.path: paratrain parallelizes causal LMs of the Llama layout (model.layers) or "
            "GPT-2's (transformer.h); this model has neither"
        )
    return list(layers)
