import numpy as np
import pytest
import torch
from conftest import make_mnist_dir
from PIL import Image

from paratrain.data.device import DeviceLoader
from paratrain.data.loader import DataConfig, build_data, load_source
from paratrain.data.sources import load_mnist, load_mnist_sample
from paratrain.data.transforms import Prepared, resize_normalize
from paratrain.errors import DataError

CPU = torch.device("cpu")


def test_embedded_sample_is_real_mnist():
    src = load_mnist_sample()
    assert (len(src.train), len(src.val)) == (4000, 1000)
    x, y = src.train[0]
    assert x.shape == (1, 28, 28) and x.dtype == torch.uint8
    labels = torch.tensor([src.val[i][1] for i in range(len(src.val))])
    assert torch.bincount(labels).tolist() == [100] * 10
    # Real digits: mostly black background with a stroke of bright pixels, not noise.
    imgs = src.train.images.float()
    assert 0.7 < (imgs == 0).float().mean() < 0.9 and imgs.max() == 255


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files_are_read(tmp_path, compress):
    x, y = make_mnist_dir(tmp_path, compress=compress)
    src = load_mnist(tmp_path)
    assert len(src.train) == 200 and len(src.val) == 50
    img, label = src.train[5]
    assert torch.equal(img[0], torch.from_numpy(x[5].astype(np.uint8))) and label == y[5]


def test_missing_mnist_names_the_files(tmp_path):
    with pytest.raises(DataError, match="train-images-idx3-ubyte and train-labels-idx1-ubyte"):
        load_mnist(tmp_path)


def test_imagefolder(tmp_path):
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i in range(5):
            size = (20 + i, 30)
            Image.fromarray(rng.integers(0, 255, (*size, 3), dtype=np.uint8)).save(
                tmp_path / cls / f"{i}.png"
            )
    cfg = DataConfig(
        source="imagefolder",
        path=str(tmp_path),
        image_size=16,
        batch_size=2,
        num_workers=0,
        val_fraction=0.2,
    )
    data = build_data(cfg, sampler_mode="full", rank=0, world=1, seed=0, device=CPU, loader_batch=2)
    assert data.source.num_classes == 2 and len(data.val.dataset) == 2
    x, y = next(iter(data.train))
    assert x.shape == (2, 3, 16, 16) and x.dtype == torch.float32


def test_synthetic_is_labelled_unreal():
    src = load_source(DataConfig(source="synthetic", synthetic_samples=100, channels=3), seed=0)
    assert not src.real and src.train[0][0].shape == (3, 28, 28)


def test_resize_normalize_statistics():
    x = torch.full((2, 1, 28, 28), 255, dtype=torch.uint8)
    y = resize_normalize(x, 64, (0.5,), (0.5,))
    assert y.shape == (2, 1, 64, 64) and torch.allclose(y, torch.ones_like(y))


def test_cpu_and_device_side_preparation_agree():
    """resize_on=cpu (per image in the worker) and resize_on=gpu (per batch after the copy) run
    the same arithmetic; here both on the CPU."""
    src = load_mnist_sample()
    cpu = Prepared(src.train, 100, src.mean, src.std, on_cpu=True)
    raw = Prepared(src.train, 100, src.mean, src.std, on_cpu=False)
    batch = torch.stack([raw[i][0] for i in range(4)])
    assert batch.dtype == torch.uint8
    loader = DeviceLoader(
        [(batch, torch.zeros(4, dtype=torch.long))],
        CPU,
        dtype=torch.float32,
        size=100,
        mean=src.mean,
        std=src.std,
        finish_on_device=True,
        non_blocking=False,
        channels_last=True,
        prefetch=True,
    )
    x, _ = next(iter(loader))
    assert x.is_contiguous(memory_format=torch.channels_last)
    expected = torch.stack([cpu[i][0] for i in range(4)])
    torch.testing.assert_close(x, expected, atol=1e-5, rtol=1e-5)


def test_loader_options_reach_the_dataloader():
    cfg = DataConfig(
        num_workers=2,
        persistent_workers=True,
        prefetch_factor=3,
        pin_memory=True,
        limit_samples=256,
        batch_size=16,
    )
    data = build_data(
        cfg, sampler_mode="distributed", rank=1, world=2, seed=0, device=CPU, loader_batch=16
    )
    loader = data.train
    assert loader.num_workers == 2 and loader.persistent_workers and loader.prefetch_factor == 3
    assert loader.pin_memory is False  # no accelerator to pin for on this machine
    assert len(loader) == 256 // 2 // 16
    x, y = next(iter(loader))
    assert x.shape == (16, 1, 28, 28)


def test_too_few_samples_is_a_user_error():
    from paratrain.errors import UserError

    cfg = DataConfig(limit_samples=10, batch_size=8, num_workers=0)
    with pytest.raises(UserError, match="data.batch_size"):
        build_data(
            cfg, sampler_mode="distributed", rank=0, world=2, seed=0, device=CPU, loader_batch=8
        )
