"""syncs.SyncSites: the host's waits for the GPU in the profiled steps, counted by the line that
made them. torch's sync debug mode needs CUDA; here the warning it raises is raised by hand."""

import traceback
import warnings

import torch

from paratrain.meters import syncs


def test_a_sync_is_named_by_paratrains_line_and_the_librarys(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", lambda mode: None)
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    sites = syncs.SyncSites(cuda=True)
    sites.start()
    for _ in range(3):
        warnings.warn("called a synchronizing CUDA operation (at x.cpp)", stacklevel=1)
    torch.cuda.synchronize()  # the explicit one, which torch's mode does not report
    with warnings.catch_warnings(record=True) as other:
        warnings.simplefilter("always")
        warnings.warn("something else", stacklevel=1)  # not a sync: shown as before, not counted
    sites.stop()
    assert [str(w.message) for w in other] == ["something else"]
    assert waited == [None]  # torch's synchronize still ran
    (warned, n), (explicit, m) = sites.counts.most_common()
    assert (n, m) == (3, 1) and "test_syncs.py" in warned and "test_syncs.py" in explicit
    assert sites.text(steps=2).splitlines() == [
        "host syncs (the host waiting for the GPU) per step: 2.0",
        f"     1.5  {warned}",
        f"     0.5  {explicit}",
    ]
    torch.cuda.synchronize()  # restored: not counted
    assert len(waited) == 2 and sum(sites.counts.values()) == 4
    # after stop() the warning is an ordinary one again
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)
    assert len(after) == 1 and sum(sites.counts.values()) == 4


def test_a_site_is_the_innermost_paratrain_frame_then_the_innermost_frame():
    own = syncs.OWN + "/trainer/step.py"
    frames = [
        traceback.FrameSummary("/x/train.py", 1, "main"),
        traceback.FrameSummary(own, 120, "finite_everywhere"),
        traceback.FrameSummary("/site/torch/_tensor.py", 9, "item"),
        traceback.FrameSummary(warnings.__file__, 3, "_showwarnmsg"),
    ]
    assert syncs.site(frames) == (
        "paratrain/trainer/step.py:120 finite_everywhere -> /site/torch/_tensor.py:9 item"
    )
    assert syncs.site(frames[:2]) == "paratrain/trainer/step.py:120 finite_everywhere"
    assert syncs.site(frames[:1]) == "/x/train.py:1 main"


def test_without_cuda_nothing_is_recorded_or_listed():
    sites = syncs.SyncSites(cuda=False)
    sites.start()
    sites.stop()
    assert sites.text(steps=3) == ""


def test_a_run_that_fails_while_profiled_leaves_torch_as_it_was(tmp_path, monkeypatch):
    """StepProfiler.discard (Trainer.fit's finally): the profiler closed, torch.cuda.synchronize
    and the sync debug mode put back, nothing written."""
    from paratrain.meters.profiling import StepProfiler

    modes = []
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    original = torch.cuda.synchronize
    profiler = StepProfiler(torch.device("cpu"), 3, tmp_path, is_main=True)
    profiler.syncs = syncs.SyncSites(cuda=True)  # as on a GPU
    profiler.start()
    assert torch.cuda.synchronize is not original and modes == ["warn"]
    profiler.discard()
    assert torch.cuda.synchronize is original and modes == ["warn", "default"]
    assert profiler._prof is None and not (tmp_path / "profile.txt").exists()
    profiler.discard()  # a second time (or never started): nothing to do
    assert modes == ["warn", "default"]
