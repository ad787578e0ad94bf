"""The int8 gradient hook's rounding on one rank: a scale per chunk of 512, so one large
gradient does not round the small ones elsewhere in the bucket to zero."""

from types import SimpleNamespace

import torch

from paratrain.parallel.ddp import INT8_CHUNK, bytes_per_element, int8_hook


def test_each_chunk_keeps_its_own_scale(one_rank_group):
    g = torch.randn(3 * INT8_CHUNK + 100, generator=torch.Generator().manual_seed(0)) * 1e-4
    g[7] = 10.0  # an outlier in the first chunk only
    out = int8_hook(None, SimpleNamespace(buffer=lambda: g)).value()
    assert out.shape == g.shape and out.dtype == g.dtype
    for c in range(4):
        part = slice(c * INT8_CHUNK, min((c + 1) * INT8_CHUNK, g.numel()))
        bound = g[part].abs().max() / 254
        assert (out[part] - g[part]).abs().max() <= bound * 1.0001, c
    rest = slice(INT8_CHUNK, None)  # chunks without the outlier: not rounded to zero
    assert torch.count_nonzero(out[rest]) > 0.95 * g[rest].numel()
    assert bytes_per_element("int8", torch.float32) == 1 + 4 / INT8_CHUNK
