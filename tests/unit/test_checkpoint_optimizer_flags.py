"""A checkpoint written with one optimizer implementation (foreach: tensor parallelism has no
fused SGD) resumes under another (fused, one GPU's plan): the run's own flags stay, and the
fused step with a found_inf flag runs (the GPU test of a TP checkpoint resumed in one process
failed with "Expected grad_scale and found_inf to be None" before)."""

import torch

from paratrain.checkpoint.store import LoopState, load_checkpoint, save_checkpoint


def test_resume_keeps_this_runs_fused_flag(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    written = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    model(torch.randn(2, 4)).sum().backward()
    written.step()
    cpu = torch.device("cpu")
    path = save_checkpoint(
        tmp_path,
        model=model,
        optimizer=written,
        scaler=None,
        state=LoopState(step=1),
        device=cpu,
        keep=1,
    )
    model.zero_grad(set_to_none=True)  # as a fresh run's: DCP then makes the momentum to load
    resumed = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    load_checkpoint(path, model=model, optimizer=resumed, scaler=None, device=cpu)
    assert all(g["fused"] and not g["foreach"] for g in resumed.param_groups)
    assert resumed.state[model.weight]["momentum_buffer"] is not None  # the state did load
    model(torch.randn(2, 4)).sum().backward()
    resumed.found_inf, resumed.grad_scale = torch.zeros(()), None  # as the step hands it
    resumed.step()
