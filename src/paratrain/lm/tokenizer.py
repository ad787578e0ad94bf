"""Tokenizers: the model's own (from model.path), or a byte-level one built in code for
random-init runs and tests, so that nothing is downloaded."""

from __future__ import annotations

from pathlib import Path

from paratrain.errors import UserError

BYTE_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|pad|>")


def byte_tokenizer():
    """Every UTF-8 byte is one token (ids 0-255), then BOS, EOS and PAD: any text encodes, and the
    ids fit any vocabulary of 259 or more (the random-init shapes have 128,256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for i, special in enumerate(BYTE_SPECIALS):
        vocab[special] = 256 + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(BYTE_SPECIALS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BYTE_SPECIALS[0],
        eos_token=BYTE_SPECIALS[1],
        pad_token=BYTE_SPECIALS[2],
    )


def _byte_of(ch: str) -> int:
    # GPT-2's byte-to-unicode map: printable bytes map to themselves, the rest to 256 + n.
    code = ord(ch)
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    if code in printable:
        return code
    others = [b for b in range(256) if b not in printable]
    return others[code - 256]


def load_tokenizer(path: str | None):
    if path is None:
        return byte_tokenizer()
    from transformers import AutoTokenizer

    p = Path(path)
    has_files = p.is_dir() and any(
        (p / name).is_file()
        for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
    )
    if p.exists() and not has_files:
        raise UserError(f"model.path: {path} has no tokenizer (tokenizer.json or tokenizer.model)")
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        raise UserError(
            f"model.path: cannot load a tokenizer from {path} ({str(e).splitlines()[0]})"
        ) from None
    if tok.pad_token is None:
        # Llama 3 ships no pad token; padding positions are masked out of attention and loss anyway.
        tok.pad_token = tok.eos_token
    return tok
