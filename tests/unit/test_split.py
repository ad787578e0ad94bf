"""strategy=split in one process: consecutive units on consecutive devices (here all the CPU),
the model's own forward unchanged; the same training as one device."""

import pytest
from conftest import TINY_SETTINGS, final_weights, max_abs_diff, train

from paratrain.config import load_config

LM = ["data.source=synthetic-text", "model.init=random", "model.shape=tiny", "device=cpu"]
LM += ["data.num_workers=0", "data.max_length=32", "data.batch_size=4", "lora.enabled=false"]
LM += ["log.progress=false", "train.max_steps=3"]
IMAGES = [*TINY_SETTINGS, "data.limit_samples=256", "train.max_steps=4"]


@pytest.mark.parametrize("settings", [IMAGES, LM], ids=["tiny_cnn", "tiny_llama"])
def test_split_equals_one_device(tmp_path, settings):
    train(load_config(None, [*settings, f"output_dir={tmp_path / 'one'}"]))
    split = train(
        load_config(
            None,
            [
                *settings,
                "strategy=split",
                "split.boundaries=[1]",
                f"output_dir={tmp_path / 'split'}",
            ],
        )
    )
    info = split["parallel"]["split"]
    assert info["devices"] == ["cpu", "cpu"] and info["units_per_device"][0] == 1
    assert info["idle_fraction_per_device"] == 0.5
    assert max_abs_diff(final_weights(tmp_path / "split"), final_weights(tmp_path / "one")) == 0.0


def test_split_over_more_gpus_than_visible_is_one_line(tmp_path):
    import torch

    from paratrain.parallel.split import SplitConfig, split_devices

    assert len(split_devices(SplitConfig(devices=3), torch.device("cpu"))) == 3
    with pytest.raises(ValueError, match="boundaries: must be increasing"):
        SplitConfig(boundaries=[2, 1])
