"""Tokenizers: the model's own (from model.path), or a byte-level one built in code
(model.tokenizer=bytes, random-init runs and tests), so that nothing is downloaded or trained."""

from __future__ import annotations

from pathlib import Path

from paratrain.errors import UserError

BYTE_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|pad|>")
# BERT's four (its [UNK] is never needed: every byte has an id)
BERT_SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[MASK]")


def byte_tokenizer():
    """Every UTF-8 byte is one token (ids 0-255), then BOS, EOS and PAD: any text encodes, and the
    ids fit any vocabulary of 259 or more (the random-init shapes have 128,256)."""
    bos, eos, pad = BYTE_SPECIALS
    return _bytes_and(BYTE_SPECIALS, bos_token=bos, eos_token=eos, pad_token=pad)


def bert_byte_tokenizer():
    """The byte tokenizer with BERT's specials after the bytes: [PAD] 256, [CLS] 257, [SEP] 258,
    [MASK] 259 (tiny-bert's vocabulary has 264 ids; bert-base's 30,522 hold them too)."""
    pad, cls, sep, mask = BERT_SPECIALS
    return _bytes_and(BERT_SPECIALS, pad_token=pad, cls_token=cls, sep_token=sep, mask_token=mask)


def _bytes_and(specials: tuple[str, ...], **roles: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet(), key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    for i, special in enumerate(specials):
        vocab[special] = 256 + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(specials))
    return PreTrainedTokenizerFast(tokenizer_object=tok, **roles)


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


# what AutoTokenizer reads a tokenizer from (with tokenizer_config.json or the model's config)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.txt")
TOKENIZER_FILES += ("vocab.json",)


def has_tokenizer(path: str) -> bool:
    p = Path(path)
    return p.is_dir() and any((p / name).is_file() for name in TOKENIZER_FILES)


def check_tokenizer(path: str | None, choice: str) -> None:
    """Before any process starts: a model folder the run takes its tokenizer from holds one."""
    if path is None or choice == "bytes" or not Path(path).is_dir() or has_tokenizer(path):
        return
    raise UserError(
        f"model.path: {path} has no tokenizer ({', '.join(TOKENIZER_FILES)}); put the model's "
        "own there, or --set model.tokenizer=bytes for paratrain's byte tokenizer (every UTF-8 "
        "byte one id, then the special tokens; no download)"
    )


def load_tokenizer(path: str | None, choice: str = "auto"):
    """model.tokenizer: auto takes model.path's own (the byte tokenizer without a path); bytes
    the byte tokenizer whatever the folder holds."""
    if path is None or choice == "bytes":
        return byte_tokenizer()
    from transformers import AutoTokenizer

    from paratrain import trust

    check_tokenizer(path, choice)
    try:
        # a folder's own tokenizer code (auto_map) runs only with --trust-code, never asked
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust.trusted())
    except (OSError, ValueError) as e:
        raise trust.remote_code(e, "model.path", path) or UserError(
            f"model.path: cannot load a tokenizer from {path} ({str(e).splitlines()[0]})"
        ) from None
    if tok.pad_token is None:
        # Llama 3 ships no pad token; padding positions are masked out of attention and loss anyway.
        tok.pad_token = tok.eos_token
    return tok
