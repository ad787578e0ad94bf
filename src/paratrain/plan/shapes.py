"""A decoder's shape as numbers (issue 52): what the analytic plan needs of a Llama-style model,
read from config fields alone (nothing downloaded, nothing allocated). Named shapes: the Llama 3.1
8B / 70B / 405B configs below (their config.json fields), and every Llama entry of the causal
LM's SHAPES (models/causal_lm/build.py); or any dict of the same Hugging Face fields."""

from __future__ import annotations

from dataclasses import dataclass

from paratrain.errors import UserError

# Llama 3.1 as meta-llama's config.json files have them (the fields SHAPES uses).
LLAMA31: dict[str, dict] = {
    "llama3.1-70b": dict(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
    "llama3.1-405b": dict(
        vocab_size=128256,
        hidden_size=16384,
        intermediate_size=53248,
        num_hidden_layers=126,
        num_attention_heads=128,
        num_key_value_heads=8,
        tie_word_embeddings=False,
    ),
}


@dataclass(frozen=True)
class Shape:
    """A Llama-style decoder: attention with grouped key-value heads, a SwiGLU MLP (gate, up,
    down), RMSNorm, untied or tied embeddings."""

    name: str
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int]]:
        """A decoder layer's matmul weights as (in, out) features."""
        h, kv, f = self.hidden, self.kv_width, self.ffn
        return {
            "q": (h, h),
            "k": (h, kv),
            "v": (h, kv),
            "o": (h, h),
            "gate": (h, f),
            "up": (h, f),
            "down": (f, h),
        }

    @property
    def layer_matmul_params(self) -> int:
        return sum(i * o for i, o in self.linears().values())

    @property
    def layer_params(self) -> int:
        return self.layer_matmul_params + 2 * self.hidden  # + the two RMSNorm weights

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def head_params(self) -> int:
        """lm_head's weight (the embedding's own when tied) and the final norm."""
        return (0 if self.tied else self.vocab * self.hidden) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.embedding_params + self.head_params


def from_config(name: str, fields: dict) -> Shape:
    if fields.get("model_type", "llama") != "llama":
        raise UserError(f"--shape {name}: the analytic plan models Llama-style decoders only")
    try:
        return Shape(
            name=name,
            hidden=int(fields["hidden_size"]),
            ffn=int(fields["intermediate_size"]),
            layers=int(fields["num_hidden_layers"]),
            heads=int(fields["num_attention_heads"]),
            kv_heads=int(fields.get("num_key_value_heads") or fields["num_attention_heads"]),
            vocab=int(fields["vocab_size"]),
            tied=bool(fields.get("tie_word_embeddings", False)),
        )
    except KeyError as e:
        raise UserError(f"--shape {name}: the config has no {e.args[0]}") from None


SAME_AS = {"llama3.1-8b": "llama3-8b"}
"""Llama 3.1 8B has Llama 3 8B's widths (SHAPES' "llama3-8b"): 3.1 lengthens the context only."""


def names() -> list[str]:
    from paratrain.models.causal_lm.build import SHAPES

    llama = (k for k, v in SHAPES.items() if v.get("model_type", "llama") == "llama")
    return [*SAME_AS, *LLAMA31, *llama]


def shape(name: str) -> Shape:
    """A named shape: Llama 3.1's, or a Llama entry of the causal LM's SHAPES."""
    if name in LLAMA31:
        return from_config(name, LLAMA31[name])
    from paratrain.models.causal_lm.build import SHAPES

    fields = SHAPES.get(SAME_AS.get(name, name))
    if fields is not None and fields.get("model_type", "llama") == "llama":
        return from_config(name, fields)
    raise UserError(f"--shape: no shape {name!r}; choose from {', '.join(names())}")
