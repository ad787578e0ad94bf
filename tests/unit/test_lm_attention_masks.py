"""models/causal_lm/attention.py: the decoder's masks from what the host knows, without
transformers reading the batch back. The logits equal transformers' sdpa path for rows without
padding, padded rows and packed rows, transformers' two host reads are not reached, and the
collate leaves the mask out only where no row is padded."""

import pytest
import torch
import transformers.masking_utils as masking

from paratrain.data.text.data import Collate
from paratrain.models.causal_lm.attention import use_own_masks
from paratrain.models.causal_lm.build import build_causal_lm
from paratrain.models.causal_lm.family import decoder_of


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    theirs = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32)
    ours = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32)
    ours.load_state_dict(theirs.state_dict())
    theirs.config.use_cache = ours.config.use_cache = False  # as the task trains
    use_own_masks(ours, decoder_of(ours))
    return theirs, ours


IDS = torch.randint(0, 100, (3, 40), generator=torch.Generator().manual_seed(1))
PADDING = torch.ones(3, 40, dtype=torch.long)
PADDING[1, 30:] = 0
PADDING[2, 5:] = 0
PACKED = torch.tensor([[*range(10), *range(30)], [*range(40)], [*range(20), *range(20)]])


@pytest.mark.parametrize(
    "inputs",
    [{}, {"attention_mask": PADDING}, {"position_ids": PACKED}],
    ids=["full rows", "padded", "packed"],
)
def test_logits_equal_transformers_sdpa(pair, inputs, monkeypatch):
    theirs, ours = pair
    with torch.no_grad():
        expected = theirs(input_ids=IDS, **inputs).logits
        # packing matters: row 0's second sequence alone
        alone = theirs(input_ids=IDS[:1, 10:], position_ids=torch.arange(30)[None]).logits

        def no_host_read(*a, **k):
            raise AssertionError("transformers read the batch back on the host")

        monkeypatch.setattr(masking, "_ignore_causal_mask_sdpa", no_host_read)
        monkeypatch.setattr(masking, "find_packed_sequence_indices", no_host_read)
        got = ours(input_ids=IDS, **inputs).logits
    real = PADDING.bool() if "attention_mask" in inputs else torch.ones_like(PADDING, dtype=bool)
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)
    if "position_ids" in inputs:
        torch.testing.assert_close(got[:1, 10:], alone, rtol=0, atol=1e-5)


def test_the_collate_leaves_out_only_a_mask_of_ones():
    collate = Collate(pad_id=0, packed=False)
    full = collate([([1, 2, 3], [1, 2, 3]), ([4, 5, 6], [4, 5, 6])])
    assert "attention_mask" not in full and int(full["num_tokens"]) == 6
    padded = collate([([1, 2, 3], [1, 2, 3]), ([4], [4])])
    assert padded["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert int(padded["num_tokens"]) == 4


def test_sliding_window_and_chunked_models_keep_transformers_masks():
    from types import SimpleNamespace

    from transformers import Gemma2Config, LlamaConfig, MistralConfig

    from paratrain.models.causal_lm.attention import plain_causal

    assert plain_causal(LlamaConfig()) and plain_causal(MistralConfig(sliding_window=None))
    assert not plain_causal(MistralConfig(sliding_window=8))
    assert not plain_causal(Gemma2Config())  # alternating sliding and full layers
    assert not plain_causal(SimpleNamespace(layer_types=["full_attention", "sliding_attention"]))
    assert plain_causal(SimpleNamespace(layer_types=["full_attention"] * 2))
    assert not plain_causal(SimpleNamespace(attention_chunk_size=8192))  # Llama 4
    model = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32)
    model.config.sliding_window = 8  # as a Mistral checkpoint's config would have it
    assert not use_own_masks(model, decoder_of(model))
    assert model.config._attn_implementation == "sdpa"
