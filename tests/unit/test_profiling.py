"""The kernel-time summary of profile.txt, on hand-made profiler rows (GPU kernels need a GPU)."""

from types import SimpleNamespace

from torch.autograd import DeviceType

from paratrain.profiling import kernel_breakdown, kernel_kind


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
