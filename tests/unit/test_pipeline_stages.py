"""strategy=pipeline's cut, in one process: the stages run one after another compute what the
whole model computes, and between them hold the whole model's parameters under the same names."""

import copy

import pytest
import torch

from paratrain.errors import UserError
from paratrain.models import ModelConfig, build_model
from paratrain.models.vision import VisionSpec, blocks_of
from paratrain.parallel.pipeline import stage_ranges


def test_stage_ranges_are_consecutive_and_near_equal():
    assert [list(r) for r in stage_ranges(5, 2)] == [[0, 1, 2], [3, 4]]
    assert [len(r) for r in stage_ranges(20, 4)] == [5, 5, 5, 5]
    with pytest.raises(UserError, match="3 pipeline stages but the model has only 2 blocks"):
        stage_ranges(2, 3)
    assert [list(r) for r in stage_ranges(5, 2, [1])] == [[0], [1, 2, 3, 4]]
    assert [len(r) for r in stage_ranges(20, 3, [4, 12])] == [4, 8, 8]
    with pytest.raises(UserError, match="pipeline.boundaries: 3 stages need 2 increasing"):
        stage_ranges(20, 3, [4])
    with pytest.raises(UserError, match="indices below 20, got \\[4, 20\\]"):
        stage_ranges(20, 3, [4, 20])


CUTS = [
    ("mobilenet_v2", 3, False),
    ("mobilenet_v2", 2, True),
    ("resnet50", 2, False),
    ("tiny_cnn", 2, True),
]


@pytest.mark.parametrize(("name", "stages", "channels_last"), CUTS)
def test_stages_in_a_row_equal_the_whole_model(name, stages, channels_last):
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name), num_classes=10, in_channels=1).eval()
    x = torch.randn(2, 1, 64, 64)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        expected = model(x)
        spec = VisionSpec()
        cuts = stage_ranges(spec.pipeline_units(model), stages)
        parts = [
            spec.make_stage(copy.deepcopy(model), cuts[s], s, stages, channels_last=channels_last)
            for s in range(stages)
        ]
        out = x
        for part in parts[:-1]:
            out = part(out)
            assert out.is_contiguous()  # what a stage sends: a whole tensor (NHWC if channels_last)
        out = parts[-1](out)
    torch.testing.assert_close(out, expected)
    names = [set(p.state_dict()) for p in parts]
    assert set().union(*names) == set(model.state_dict())  # all of it, under the same names
    assert sum(len(n) for n in names) == len(model.state_dict())  # and each tensor once
    assert len(blocks_of(model)) >= stages


def test_a_model_it_cannot_cut_is_a_one_line_error():
    with pytest.raises(UserError, match="strategy: pipeline cuts MobileNetV2, ResNet-50"):
        blocks_of(torch.nn.Linear(2, 2))
