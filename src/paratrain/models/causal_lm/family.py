"""Where a causal LM family keeps its parts: one small description per family, chosen from the
HF config's model_type, so that the spec, the loss wrapper and LoRA name the decoder, its layers,
embeddings and final norm without branching on the family themselves.

Llama's layout (model.embed_tokens, model.layers, model.norm, rotary positions) also fits the
families that copied it (Mistral, Qwen2, ...), so it is the default; GPT-2 keeps its decoder at
transformer.{wte, wpe, h, ln_f} and its projections as transformers' Conv1D (weight [in, out]).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from torch import nn


@dataclass(frozen=True)
class Family:
    family: str
    decoder: str
    """The LM's attribute holding the decoder (whose forward returns last_hidden_state)."""
    layers: str
    """The decoder's list of transformer blocks."""
    embeddings: tuple[str, ...]
    """The decoder's lookup tables (token, and learned positions where the family has them)."""
    norm: str
    """The decoder's final norm, before lm_head."""
    lora_targets: tuple[str, ...]
    """Default lora.target_modules (suffixes of module names, as peft matches them)."""
    conv1d: bool = False
    """Projections are Conv1D ([in, out] weights): peft needs fan_in_fan_out."""
    levers_measured: bool = False
    """The GPU levers `auto` picks for a causal LM beyond the safe ones (CUDA graphs, bf16
    weights, the fused loss, one graph over the decoder, the float8 hint) were measured on this
    family's shapes (tasks/lm_levers.py); elsewhere `auto` keeps to what was measured."""
    analytic: bool = False
    """Its layer is the one the analytic forecast prices (forecast/analytic/): grouped-query
    attention with rotary positions, a gated (SwiGLU) MLP, RMSNorm."""
    layers_key: str = "num_hidden_layers"
    """The config field of its decoder layer count (model.layers replaces it)."""
    learned_positions: bool = False
    """One embedding learned per position (max_position_embeddings of them): a longer row is
    an index past the table. Rotary positions have no such end."""
    hf_classes: tuple[str, str] = ("LlamaConfig", "LlamaForCausalLM")
    """transformers' config and model classes a named shape of the family is built with."""
    parts: str | None = None
    """The module of a family whose parts differ from Llama's (its folder, imported when a
    plan or a stage needs it): `tp_plan(base, sequence_parallel=, loss_parallel=)` and
    `stage_body(decoder, layers, first, options)`. None: Llama's, in spec.py."""


LLAMA = Family(
    family="llama",
    decoder="model",
    layers="layers",
    embeddings=("embed_tokens",),
    norm="norm",
    lora_targets=("q_proj", "v_proj", "o_proj"),  # the seed's (torchtune's) choice
    levers_measured=True,
    analytic=True,
)

GPT2 = Family(
    family="gpt2",
    decoder="transformer",
    layers="h",
    embeddings=("wte", "wpe"),
    norm="ln_f",
    # the fused q/k/v and attention's output projection; "attn.c_proj" leaves the MLP's c_proj
    # (the same name) out, as Llama's default leaves the MLP out
    lora_targets=("attn.c_attn", "attn.c_proj"),
    conv1d=True,
    layers_key="n_layer",
    learned_positions=True,
    hf_classes=("GPT2Config", "GPT2LMHeadModel"),
    parts="paratrain.models.causal_lm.gpt2",
)

FAMILIES = {"llama": LLAMA, "gpt2": GPT2}
# Families that copied Llama's layout and layer: the same record under their own name, with
# the levers that were measured on Llama itself left to `auto`'s safe set
for _name in ("mistral", "qwen2", "qwen3"):
    FAMILIES[_name] = replace(LLAMA, family=_name, levers_measured=False)


def family_named(model_type: str) -> Family:
    """A family by its config's model_type. One not known here is taken to keep Llama's layout
    (as most decoders since do), with neither measured levers nor the analytic forecast."""
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    return replace(LLAMA, family=model_type, levers_measured=False, analytic=False)


def family_of(model_or_config) -> Family:
    """The family of a model (a peft or loss wrapper too), an HF config or a SHAPES entry."""
    obj = model_or_config
    if hasattr(obj, "get_base_model"):
        obj = obj.get_base_model()
    config = getattr(obj, "config", obj) if isinstance(obj, nn.Module) else obj
    kind = config.get("model_type", "llama") if isinstance(config, dict) else config.model_type
    return family_named(kind)


def family_parts(family: Family):
    """The family's own module (Family.parts), or None for Llama's layout."""
    if family.parts is None:
        return None
    import importlib

    return importlib.import_module(family.parts)


def decoder_of(base: nn.Module) -> nn.Module:
    """The transformers model's decoder (Llama's .model, GPT-2's .transformer)."""
    return getattr(base, family_of(base).decoder)
