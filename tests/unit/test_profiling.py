"""The kernel-time summary of profile.txt, on hand-made profiler rows (GPU kernels need a GPU)."""

from types import SimpleNamespace

from torch.autograd import DeviceType

from paratrain.meters.profiling import kernel_breakdown, kernel_kind


def test_kernel_kinds_by_name():
    assert kernel_kind("triton_red_fused__native_batch_norm_legit_functional_0") == (
        "Triton, inductor-generated"
    )
    assert kernel_kind("sm90_xmma_wgrad_implicit_gemm_indexed_bf16bf16") == (
        "convolution (cuDNN / ATen conv)"
    )
    assert kernel_kind("void cudnn::ops::nchwToNhwcKernel<float>") == (
        "convolution (cuDNN / ATen conv)"
    )
    assert kernel_kind("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "matmul (cuBLAS / CUTLASS)"
    assert kernel_kind("void at::native::(anonymous)::multi_tensor_apply_kernel<...>") == (
        "optimizer (foreach / fused)"
    )
    assert kernel_kind("Memcpy HtoD (Pinned -> Device)") == "copies and fills"
    assert kernel_kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "NCCL collectives"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16") == "attention"
    assert kernel_kind("void cudnn::fusion::compute_dot_do_o_specialized<true>") == "attention"
    # a step's loss and optimizer apart from the rest, whoever wrote their kernels
    assert kernel_kind("triton_red_fused__log_softmax__to_copy_prepare_softmax_0") == (
        "loss (cross-entropy)"
    )
    assert kernel_kind("_loss_and_gradient") == "loss (cross-entropy)"
    assert kernel_kind("_adamw_master") == "optimizer (foreach / fused)"
    assert kernel_kind("something new") == "other"


def test_breakdown_sums_kernels_per_step_and_ignores_cpu_ops():
    def row(key, us, count, device=DeviceType.CUDA, annotation=False):
        return SimpleNamespace(
            key=key,
            self_device_time_total=us,
            count=count,
            device_type=device,
            is_user_annotation=annotation,
        )

    rows = [
        row("triton_poi_fused_0", 3000.0, 6),
        row("sm90_xmma_fprop_implicit_gemm", 5000.0, 2),
        row("aten::convolution", 9000.0, 2, DeviceType.CPU),  # an operator, not a kernel
        # a record_function range on the GPU timeline (DDP's forward): spans kernels, is none
        row("DistributedDataParallel.forward", 7000.0, 2, annotation=True),
    ]
    text = kernel_breakdown(rows, wall_ms=8.0, steps=2)  # 8 ms of kernels over 2 steps
    assert "GPU kernel time per step: 4.00 ms (50% of the wall time)" in text
    lines = text.splitlines()
    conv = next(line for line in lines if line.strip().startswith("convolution"))
    assert conv.split()[-3:] == ["2.50", "62.5%", "1"]
    assert lines.index(conv) < next(i for i, line in enumerate(lines) if "Triton" in line)


def ev(name, start, end, device=DeviceType.CPU, kernels=(), annotation=False):
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start, end=end),
        device_type=device,
        kernels=[SimpleNamespace(name=k, duration=d) for k, d in kernels],
        is_user_annotation=annotation,
    )


def test_phases_credit_each_kernel_to_the_range_that_launched_it():
    from paratrain.meters.profiling import phase_times

    events = [
        ev("paratrain.forward", 0, 100),
        ev("paratrain.backward", 100, 300),
        ev("paratrain.optimizer", 300, 320),
        ev("aten::conv2d", 10, 20, kernels=[("cudnn_fprop", 40.0)]),
        ev("aten::mm", 50, 60, kernels=[("gemm", 10.0)]),
        # autograd's thread: another thread, inside the backward's time
        ev("aten::convolution_backward", 150, 160, kernels=[("dgrad", 70.0), ("wgrad", 30.0)]),
        # DDP's own range with its annotation listed as a "kernel" of its name: not work
        ev(
            "DistributedDataParallel.forward",
            5,
            95,
            kernels=[("DistributedDataParallel.forward", 99.0)],
        ),
        ev("aten::_foreach_add_", 305, 310, kernels=[("multi_tensor_apply", 6.0)]),
        ev("aten::copy_", 400, 410, kernels=[("memcpy", 2.0)]),  # between steps: no phase
    ]
    t = phase_times(events, steps=2, wall_ms=0.25, gpu=True)
    assert {k: v["gpu_ms"] for k, v in t["phases"].items()} == {
        "forward": 0.025,  # (40 + 10) us / 2 steps
        "backward": 0.05,
        "optimizer": 0.003,
    }
    assert t["phases"]["backward"]["cpu_ms"] == 0.1 and abs(t["other_ms"] - 0.09) < 1e-12
    cpu = phase_times(events, steps=2, wall_ms=0.25, gpu=False)
    assert "gpu_ms" not in cpu["phases"]["forward"] and "communication" not in cpu


def test_nccl_time_split_into_overlapped_and_exposed():
    from paratrain.meters.profiling import communication

    gpu = DeviceType.CUDA
    events = [
        ev("dgrad_kernel", 0, 100, gpu),
        ev("wgrad_kernel", 90, 150, gpu),  # the compute union is 0-150
        ev("ncclDevKernel_AllReduce", 120, 200, gpu),  # 30 us beside compute, 50 alone
        ev("ncclDevKernel_AllReduce", 300, 340, gpu),  # 40 alone (the last bucket)
        ev("paratrain.backward", 0, 400, gpu),  # a phase's annotation: neither
        ev("DistributedDataParallel.forward", 0, 400, gpu, annotation=True),
    ]
    c = communication(events, steps=1)
    assert c == {"nccl_ms": 0.12, "overlapped_ms": 0.03, "exposed_ms": 0.09}
    assert communication(events[:2], steps=1) is None  # one GPU: no NCCL kernels
