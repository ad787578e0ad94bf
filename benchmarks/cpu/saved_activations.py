"""What one Llama decoder layer saves for backward per token, full training against LoRA, on the
CPU: the forecast's saved_per_token (src/paratrain/forecast/analytic/step.py) beside autograd's
own count.

A small Llama (transformers' LlamaForCausalLM, sdpa attention, bf16, the 8B's proportions: hidden
512, 8 heads of 64, 2 key-value heads, MLP 1,792) runs one forward of 2 x 256 tokens; a
torch.autograd.graph.saved_tensors_hooks pack hook sees every tensor autograd saves, keyed by
(data_ptr, bytes) so that a tensor two ops save counts once; parameters (and their views) are
skipped. The decoder layers' share is the total with four layers less the total with two, over
two layers and the tokens. Rows: full training; LoRA r 8 on q, v, o (peft, base weights frozen);
LoRA on every linear; each also as the forecast prices it.

    PYTHONPATH=src python3 benchmarks/cpu/saved_activations.py [OUT]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from paratrain.forecast.analytic.step import Training, saved_per_token
from paratrain.forecast.shapes import Shape

H, HEADS, KV_HEADS, FFN, VOCAB = 512, 8, 2, 1792, 1024
BATCH, SEQ = 2, 256


def model(layers: int, lora: tuple[str, ...] | None) -> torch.nn.Module:
    cfg = LlamaConfig(
        hidden_size=H,
        intermediate_size=FFN,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        vocab_size=VOCAB,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).to(torch.bfloat16)
    if lora:
        from peft import LoraConfig, get_peft_model

        m = get_peft_model(m, LoraConfig(r=8, lora_alpha=16, target_modules=list(lora)))
    return m


def saved_bytes(layers: int, lora: tuple[str, ...] | None) -> int:
    m = model(layers, lora)
    params = {p.data_ptr() for p in m.parameters()}
    seen: dict[tuple[int, int], int] = {}

    def pack(t: torch.Tensor):
        if t.data_ptr() not in params and t.untyped_storage().data_ptr() not in params:
            key = (t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
            seen[key] = key[1]
        return t

    ids = torch.randint(0, VOCAB, (BATCH, SEQ))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = m(input_ids=ids, labels=ids)
    del out
    return sum(seen.values())


def per_token_layer(lora: tuple[str, ...] | None) -> float:
    """Bytes a decoder layer saves per token: four layers' total less two layers'."""
    return (saved_bytes(4, lora) - saved_bytes(2, lora)) / 2 / (BATCH * SEQ)


def main() -> None:
    shape = Shape("small", H, FFN, 2, HEADS, KV_HEADS, VOCAB)
    rows = []
    for label, lora in (
        ("full training", None),
        ("LoRA q, v, o", ("q_proj", "v_proj", "o_proj")),
        (
            "LoRA every linear",
            ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        ),
    ):
        measured = per_token_layer(lora)
        priced = saved_per_token(shape, Training(SEQ, BATCH, "none", lora=lora is not None))
        rows.append({"row": label, "measured": measured, "forecast": priced})
        print(f"{label}: {measured:,.0f} bytes a token a layer; forecast {priced:,.0f}")
    if len(sys.argv) > 1:
        out = Path(sys.argv[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "saved_activations.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
