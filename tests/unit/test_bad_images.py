"""An image folder's unreadable files named before training (issue 50, item 11): every file's
header checked by PIL in the launching process; data.bad_images=error refuses the run in one
line naming them (exit 2, no run folder), skip trains without them and says how many."""

import numpy as np
from conftest import TINY
from PIL import Image

from paratrain.cli import main
from paratrain.data import images


def image_folder(root, *, corrupt=(), truncated=()):
    """Two classes of 8 small gray PNGs; the named files replaced by garbage or cut short."""
    rng = np.random.default_rng(0)
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for i in range(8):
            pixels = rng.integers(0, 255, (20, 20), dtype=np.uint8)
            Image.fromarray(pixels).save(root / cls / f"{i}.png")
    for name in corrupt:
        (root / name).write_bytes(b"not an image at all" * 10)
    for name in truncated:  # the header intact, the pixel chunks cut off
        path = root / name
        path.write_bytes(path.read_bytes()[:60])
    return root


def test_unreadable_files_are_found_and_named(tmp_path, monkeypatch):
    root = image_folder(tmp_path / "imgs", corrupt=["a/3.png"], truncated=["b/5.png"])
    paths = sorted(str(p) for p in root.rglob("*.png"))
    monkeypatch.setattr(images, "PROGRESS_FROM", 4)  # the bar's path too, on 16 files
    monkeypatch.setattr(images, "CHUNK", 3)  # several threads' chunks, answers kept in order
    bad = images.unreadable(paths, progress=True)
    assert [p for p, _ in bad] == [str(root / "a/3.png"), str(root / "b/5.png")]
    assert "cannot identify image file" in bad[0][1]
    line = images.named(bad, str(root))
    assert line.startswith("a/3.png (UnidentifiedImageError") and "; b/5.png (" in line
    monkeypatch.setattr(images, "SHOWN", 1)
    assert images.named(bad, str(root)).endswith("; and 1 more")


def test_a_jpeg_cut_short_is_found(tmp_path, monkeypatch):
    """PIL's verify reads a JPEG's header only: a download cut short passes it, and is found by
    its missing end-of-image marker, then decoded to be sure; a whole JPEG passes without being
    decoded, and so does one carrying more after its marker than the end searched (a phone's
    motion photo appends a video) once it decodes; a multi-picture JPEG (MPO) cut short too."""
    decoded = []
    undecodable = images._undecodable
    monkeypatch.setattr(images, "_undecodable", lambda p: decoded.append(p) or undecodable(p))
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)
    names = ("whole", "cut", "padded", "motion", "multi", "multi_cut")
    whole, cut, padded, motion, multi, multi_cut = (tmp_path / f"{n}.jpg" for n in names)
    Image.fromarray(pixels).save(whole)
    data = whole.read_bytes()
    cut.write_bytes(data[: len(data) - 200])
    padded.write_bytes(data + bytes(100))
    tail = rng.integers(0, 256, 3 * images.JPEG_TAIL, dtype=np.uint8).tobytes()
    motion.write_bytes(data + tail.replace(b"\xff\xd9", b"\x00\x00"))  # no marker at its end
    Image.fromarray(pixels).save(
        multi, "MPO", save_all=True, append_images=[Image.fromarray(pixels)]
    )
    multi_cut.write_bytes(multi.read_bytes()[: multi.stat().st_size // 4])
    for fine in (whole, padded, multi):
        assert images.problem(str(fine)) is None, fine.name
    assert decoded == []
    assert images.problem(str(motion)) is None and decoded == [str(motion)]
    for bad in (cut, multi_cut):
        why = images.problem(str(bad))
        assert why and why.startswith("no end-of-image marker, and OSError"), (bad.name, why)


def run(tmp_path, root, *sets):
    sets = ["data.source=imagefolder", f"data.path={root}", "data.image_size=28",
            "data.channels=1", "data.batch_size=4", "data.val_fraction=0", "strategy=single",
            "train.max_steps=2", "train.warmup_steps=0", *sets]  # fmt: skip
    args = [a for s in sets for a in ("--set", s)]
    return main(
        ["run", "recipes/tiny_cpu.yaml", *TINY, *args, "--output-dir", str(tmp_path / "run")]
    )


def test_a_corrupt_image_refuses_the_run_before_it_starts(tmp_path, capsys):
    root = image_folder(tmp_path / "imgs", corrupt=["b/7.png"])
    assert run(tmp_path, root) == 2
    err = capsys.readouterr().err
    assert err.count("error") == 1 and "Traceback" not in err and len(err.splitlines()) == 1
    assert "data.path: 1 image of 16" in err and "b/7.png (UnidentifiedImageError" in err
    assert "data.bad_images=skip" in err
    assert not (tmp_path / "run").exists()  # refused before any run folder


def test_skip_trains_without_them_and_says_how_many(tmp_path, capsys):
    root = image_folder(tmp_path / "imgs", corrupt=["b/7.png"])
    assert run(tmp_path, root, "data.bad_images=skip", "train.max_steps=4") == 0
    out = capsys.readouterr().out
    assert out.count("skipped 1 image of 16") == 1 and "b/7.png" in out
    # the run trained on the 15 others: 3 full batches of 4 in an epoch, none of them failed
    assert (tmp_path / "run" / "result.json").is_file()


def test_skip_applies_to_image_folders_only(tmp_path, capsys):
    assert main(["run", "recipes/tiny_cpu.yaml", *TINY, "--set", "data.bad_images=skip",
                 "--output-dir", str(tmp_path / "run")]) == 2  # fmt: skip
    assert "data.bad_images: skip leaves out an imagefolder's" in capsys.readouterr().err


def test_the_launch_hands_its_findings_to_its_workers(tmp_path, monkeypatch):
    """What the launching process found is what a worker leaves out, without reading the
    folder again; a folder it did not check (another file count) is checked by the worker."""
    root = image_folder(tmp_path / "imgs", corrupt=["a/3.png"])
    paths = sorted(str(p) for p in root.rglob("*.png"))
    monkeypatch.setenv(images.HANDED, "")  # hand_down's value undone after the test
    monkeypatch.setattr(images, "_checked", {})
    found = images.bad_files(str(root), paths)
    images.hand_down(tmp_path)
    assert (tmp_path / "checked_images.json").is_file()
    monkeypatch.setattr(images, "_checked", {})  # a worker's fresh process
    read = []
    monkeypatch.setattr(images, "unreadable", lambda p, **k: read.append(len(p)) or [])
    assert images.bad_files(str(root), paths) == found == [(str(root / "a/3.png"), found[0][1])]
    assert read == []
    assert images.bad_files(str(root), paths[:-1]) == [] and read == [15]


def test_a_mended_folder_is_checked_again_by_the_next_run(tmp_path, capsys):
    """In one Python process (a notebook): a file mended after a run is not refused by the
    next run on an old finding."""
    root = image_folder(tmp_path / "imgs", corrupt=["b/7.png"])
    assert run(tmp_path / "first", root, "data.bad_images=skip") == 0
    assert "skipped 1 image of 16" in capsys.readouterr().out
    pixels = np.random.default_rng(1).integers(0, 255, (20, 20), dtype=np.uint8)
    Image.fromarray(pixels).save(root / "b" / "7.png")
    assert run(tmp_path / "second", root) == 0
