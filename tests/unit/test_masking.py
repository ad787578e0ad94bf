"""BERT's masked-LM corruption (data/text/masking.py): the stated fraction, 80/10/10, reproducible by
key, independent of batch layout."""

import torch

from paratrain.data.text.masking import IGNORE, mask_batch, mask_row, sample_generator

MASK_ID, VOCAB = 259, 264


def row(length=130, seed=0):
    """[CLS] body [SEP] then padding: only the body is maskable."""
    body = torch.randint(0, 256, (length - 2,), generator=torch.Generator().manual_seed(seed))
    ids = torch.cat([torch.tensor([257]), body, torch.tensor([258, 256, 256])])
    maskable = torch.zeros(len(ids), dtype=torch.bool)
    maskable[1 : length - 1] = True
    return ids, maskable


def corrupt(ids, maskable, key=(0, 0, 7)):
    return mask_row(
        ids, maskable, mask_id=MASK_ID, vocab_size=VOCAB, generator=sample_generator(*key)
    )


def test_masks_round_15_percent_of_maskable_positions_only():
    for length in (3, 10, 41, 130, 512):
        ids, maskable = row(length)
        out, labels = corrupt(ids, maskable)
        chosen = labels != IGNORE
        assert chosen.sum().item() == max(1, round(0.15 * (length - 2)))
        assert not chosen[~maskable].any()  # [CLS], [SEP] and padding are never chosen
        assert torch.equal(labels[chosen], ids[chosen])  # the label is the original token
        assert torch.equal(out[~chosen], ids[~chosen])  # nothing else changes


def test_eighty_ten_ten_over_many_rows():
    masked = randomized = kept = 0
    for i in range(400):
        ids, maskable = row(130, seed=i)
        out, labels = corrupt(ids, maskable, key=(1, 0, i))
        chosen = labels != IGNORE
        masked += (out[chosen] == MASK_ID).sum().item()
        same = out[chosen] == ids[chosen]
        kept += same.sum().item()
        randomized += (~same & (out[chosen] != MASK_ID)).sum().item()
    total = masked + randomized + kept
    assert total == 400 * round(0.15 * 128)
    # 7,600 draws: a binomial's standard deviation is under 0.5% here; a random token equal to
    # the original (1 in 264) counts as kept
    assert abs(masked / total - 0.8) < 0.02
    assert abs(randomized / total - 0.1) < 0.015
    assert abs(kept / total - 0.1) < 0.015


def test_same_key_same_mask_other_key_other_mask_inputs_untouched():
    ids, maskable = row(200)
    before = ids.clone()
    a = corrupt(ids, maskable, (3, 1, 42))
    b = corrupt(ids, maskable, (3, 1, 42))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert torch.equal(ids, before)
    for other in ((3, 2, 42), (3, 1, 43), (4, 1, 42)):  # next epoch, next sample, other seed
        c = corrupt(ids, maskable, other)
        assert not torch.equal(a[1], c[1])


def test_batch_layout_does_not_change_a_rows_mask():
    """A row keyed by its data-set index masks the same in any batch, on any rank."""
    rows = [row(64, seed=s) for s in range(6)]
    ids = torch.stack([r[0] for r in rows])
    maskable = torch.stack([r[1] for r in rows])
    indices = torch.tensor([10, 11, 12, 13, 14, 15])
    kw = dict(seed=5, epoch=2, mask_id=MASK_ID, vocab_size=VOCAB)
    whole = mask_batch(ids, maskable, indices, **kw)
    order = torch.tensor([4, 0, 5, 2])  # another rank's batch: other rows, other order
    part = mask_batch(ids[order], maskable[order], indices[order], **kw)
    assert torch.equal(part[0], whole[0][order]) and torch.equal(part[1], whole[1][order])


def test_loader_workers_mask_for_the_epoch_the_training_process_sets():
    """masked_lm masks in the loader workers: a persistent worker reads the epoch from shared
    memory, so each epoch's batches carry that epoch's masks (as one process computes them)."""
    from torch.utils.data import DataLoader

    from paratrain.data.samplers import EpochSampler
    from paratrain.tasks.masked_lm import EpochFed, MaskedCollate, MaskedRows

    rows = [row(40, seed=s)[0][:40].tolist() for s in range(8)]
    specials = torch.tensor([256, 257, 258, 259])
    kw = dict(seed=3, mask_id=MASK_ID, vocab_size=VOCAB)

    def batches(epoch_box, workers):
        sampler = EpochSampler(torch.utils.data.SequentialSampler(rows))
        data = MaskedRows(rows, specials, epoch=epoch_box, **kw)
        loader = DataLoader(
            data,
            batch_size=4,
            sampler=sampler,
            collate_fn=MaskedCollate(256),
            num_workers=workers,
            persistent_workers=workers > 0,
        )
        fed, out = EpochFed(loader, sampler, epoch_box), []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            out.append([b["labels"] for b in fed])
        return out

    with_workers = batches(torch.zeros((), dtype=torch.int64).share_memory_(), 1)
    in_process = batches(torch.zeros((), dtype=torch.int64), 0)
    for epoch in range(2):
        for a, b in zip(with_workers[epoch], in_process[epoch], strict=True):
            assert torch.equal(a, b)
    assert not torch.equal(with_workers[0][0], with_workers[1][0])  # a new mask each epoch
