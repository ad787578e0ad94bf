"""A decoder's shape as numbers: what the analytic plan needs of a Llama-style model,
read from config fields alone (nothing downloaded, nothing allocated). Named shapes: the
causal LM's one table (models/causal_lm/build.py SHAPES, Llama 3.1 8B / 70B / 405B among them);
or any dict of the same Hugging Face fields."""

from __future__ import annotations

from dataclasses import dataclass

from paratrain.errors import UserError
from paratrain.models.causal_lm.family import family_of


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
    head_size: int = 0
    """A head's width where the config names one apart from hidden / heads (Qwen3, Mistral
    Nemo: head_dim); 0: hidden / heads."""

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int]]:
        """A decoder layer's matmul weights as (in, out) features."""
        h, q, kv, f = self.hidden, self.q_width, self.kv_width, self.ffn
        return {
            "q": (h, q),
            "k": (h, kv),
            "v": (h, kv),
            "o": (q, h),
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
    if not family_of(fields).analytic:
        raise UserError(
            f"--shape {name}: the analytic plan models Llama-style decoders only (Llama, Mistral, "
            f"Qwen2/3), not model_type {fields.get('model_type')!r}"
        )
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
            head_size=int(fields.get("head_dim") or 0),
        )
    except KeyError as e:
        raise UserError(f"--shape {name}: the config has no {e.args[0]}") from None


def names() -> list[str]:
    """The shapes the analytic plan prices: the causal LM's table (models/causal_lm/build.py
    SHAPES, its config-only Llama 3.1 entries among them) where the family's layer is one the
    plan models."""
    from paratrain.models.causal_lm.build import SHAPES

    return [k for k, v in SHAPES.items() if family_of(v).analytic]


def shape(name: str) -> Shape:
    """A named shape of the causal LM's table, or the path of a Hugging Face config.json (or
    of the folder holding one) of a Llama-, Mistral- or Qwen-style decoder."""
    from paratrain.models.causal_lm.build import SHAPES

    if name not in SHAPES and ("/" in name or name.endswith(".json")):
        return from_file(name)

    fields = SHAPES.get(name)
    if fields is not None and family_of(fields).analytic:
        return from_config(name, fields)
    raise UserError(f"--shape: no shape {name!r}; choose from {', '.join(names())}")


def from_file(name: str) -> Shape:
    """A config.json's fields as a Shape: nothing else of the checkpoint is read."""
    import json
    from pathlib import Path

    path = Path(name)
    path = path / "config.json" if path.is_dir() else path
    try:
        fields = json.loads(path.read_text())
    except OSError as e:
        raise UserError(f"--shape: cannot read {path} ({e.strerror or e})") from None
    except ValueError as e:
        raise UserError(f"--shape: {path} is not JSON ({e})") from None
    if not isinstance(fields, dict):
        raise UserError(f"--shape: {path} holds no config object")
    fields = fields.get("text_config", fields)  # a multimodal config's language model
    return from_config(path.parent.name or str(path), fields)
