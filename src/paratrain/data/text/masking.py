"""BERT's masked-language-model corruption (Devlin et al. 2019, §3.1 and App. A.1), as a pure
function of the row and a key.

Of a row's maskable positions (not [CLS] / [SEP] / [PAD]), round(15%) are chosen (at least one),
as the original create_pretraining_data.py does: a fixed count per row rather than a coin per
token, so equal-length rows carry equal numbers of trained tokens, and a batch's mean loss is the
same whichever data-parallel ranks its rows land on. Of the chosen: 80% become [MASK], 10% a
random token, 10% stay; the label is the original token there and -100 everywhere else.

The key is (seed, epoch, sample index): every rank, every layout and a resumed run corrupt one
sample identically, and each epoch corrupts it afresh (RoBERTa's dynamic masking).
"""

from __future__ import annotations

import torch

IGNORE = -100
MASK_FRACTION = 0.15
# of the chosen: [MASK] below 0.8, a random token below 0.9, unchanged above
TO_MASK, TO_RANDOM = 0.8, 0.9


def sample_generator(seed: int, epoch: int, index: int) -> torch.Generator:
    """A generator that depends on these three numbers only (mixed so that nearby keys give
    unrelated streams; the product of large odd constants keeps them apart)."""
    key = (seed * 1_000_003 + epoch) * 2_147_483_647 + index
    return torch.Generator().manual_seed(key % (2**63 - 1))


def mask_row(
    ids: torch.Tensor,
    maskable: torch.Tensor,
    *,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator,
    fraction: float = MASK_FRACTION,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [length] and maskable [length] (bool) -> (corrupted ids, labels). Pure: the inputs
    are not changed, and the same generator state gives the same result."""
    ids = ids.clone()
    labels = torch.full_like(ids, IGNORE)
    where = maskable.nonzero().flatten()
    if len(where) == 0:
        return ids, labels
    count = max(1, round(fraction * len(where)))
    chosen = where[torch.randperm(len(where), generator=generator)[:count]]
    labels[chosen] = ids[chosen]
    roll = torch.rand(count, generator=generator)
    randoms = torch.randint(0, vocab_size, (count,), generator=generator)
    ids[chosen] = torch.where(
        roll < TO_MASK, mask_id, torch.where(roll < TO_RANDOM, randoms, ids[chosen])
    )
    return ids, labels


def mask_batch(
    input_ids: torch.Tensor,
    maskable: torch.Tensor,
    indices: torch.Tensor,
    *,
    seed: int,
    epoch: int,
    mask_id: int,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [batch, length] whose data-set indices are `indices` -> (corrupted, labels)."""
    rows = [
        mask_row(
            input_ids[r],
            maskable[r],
            mask_id=mask_id,
            vocab_size=vocab_size,
            generator=sample_generator(seed, epoch, int(indices[r])),
        )
        for r in range(len(input_ids))
    ]
    return torch.stack([r[0] for r in rows]), torch.stack([r[1] for r in rows])
