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


def test_interleaved_stages_of_a_language_model_in_order_equal_the_whole_model():
    """Two ranks holding two stages each (rank 0: stages 0 and 2, rank 1: 1 and 3), run in
    stage order, compute the whole model's logits; the two ranks' models hold all its
    parameters once, under the same names."""
    from types import SimpleNamespace

    from paratrain.models.causal_lm.build import build_causal_lm
    from paratrain.models.causal_lm.spec import CausalLMSpec
    from paratrain.parallel.pipeline import PipelineConfig, cut_stage

    torch.manual_seed(0)
    model = build_causal_lm(None, "random", "tiny", "sdpa", torch.float32, layers=4).eval()
    ids = torch.randint(0, 320, (2, 16))
    cfg = PipelineConfig(schedule="interleaved-1f1b")
    ranks = [copy.deepcopy(model) for _ in range(2)]
    stages = [
        cut_stage(m, CausalLMSpec(), SimpleNamespace(pp=2, pp_rank=r), cfg)
        for r, m in enumerate(ranks)
    ]
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        out = ids
        for k in range(2):
            for r in range(2):
                out = stages[r][k](out)
    torch.testing.assert_close(out, expected)
    names = [set(m.state_dict()) for m in ranks]
    assert names[0] | names[1] == set(model.state_dict()) and not names[0] & names[1]
    assert {n for n, _ in stages[0][1].named_parameters()} == {  # stage 2: layer 2 only
        n.removeprefix("model.").replace(".2.", ".0.")
        for n in names[0]
        if n.startswith("model.layers.2.")
    }
