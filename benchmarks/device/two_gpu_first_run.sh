#!/usr/bin/env bash
# Issue 2's GPU run on the lent 2xH200 machine (device tool, kind nvidia-h200-x2), plus the GPU
# tests and a first look at single-GPU speed options for issue 3. Writes everything under $OUT.
#   device run: bash benchmarks/device/two_gpu_first_run.sh   (carry: .whl with mlxtend's wheel)
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
{
  nvidia-smi; nproc; free -g
  python3 -c "import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.version.cuda, torch.cuda.nccl.version(), torch.cuda.device_count())"
} > "$OUT/machine.txt" 2>&1

python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" | tail -3

# The issue's run: ddp-ds on 2 GPUs, 500x500, fp16, seed-style loader (4 workers, CPU resize, pinned).
python3 -m paratrain run recipes/mnist_sample_mobilenetv2.yaml --nproc 2 \
  --set strategy=ddp-ds --set precision=fp16 --set data.pin_memory=true --set train.epochs=3 \
  --set log.progress=false --set checkpoint.dir=/tmp/ckpt --output-dir "$OUT/ddp_ds_fp16_2gpu" \
  2>&1 | tee "$OUT/ddp_ds_fp16_2gpu.log" | grep -E "^epoch|^paratrain"

# A first look, 1 GPU, synthetic 500x500, 150 steps each: which levers move throughput.
probe() {
  name=$1; shift
  python3 -m paratrain run recipes/synthetic_throughput.yaml --set strategy=single --set train.max_steps=150 \
    --set train.warmup_steps=30 --set log.progress=false --output-dir /tmp/probe_$name "$@" >/tmp/probe_$name.log 2>&1
  python3 - "$name" <<'PY'
import json, sys
r = json.load(open(f"/tmp/probe_{sys.argv[1]}/result.json"))["summary"]
print(f"{sys.argv[1]:28s} {r['unique_samples_per_s']:8.0f} img/s  step {r['step_time_s']*1000:6.1f} ms  peak {r['peak_memory_bytes']/2**30:5.1f} GiB")
PY
}
{
  probe seed_fp16_cpu_resize --set precision=fp16 --set data.resize_on=cpu --set train.channels_last=false --set train.cudnn_benchmark=false
  probe fp16_gpu_resize --set precision=fp16 --set train.channels_last=false --set train.cudnn_benchmark=false
  probe bf16_gpu_resize_cl_bench
  probe bf16_cl_bench_prefetch --set data.prefetch_to_device=true
  probe bf16_cl_bench_compile --set train.compile=true
} 2>&1 | tee "$OUT/probe.txt"
