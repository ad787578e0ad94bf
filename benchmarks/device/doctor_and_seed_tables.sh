#!/usr/bin/env bash
# Issue 17 on one GPU. MODE=doctor: `paratrain doctor` with the MNIST recipe, one profiled run
# bound to its GPU's NUMA node (step phases, the rank's CPU affinity), then the seed's precision
# table on 1 GPU with energy per sample (through sweeps.sh: the DB and report come back).
# MODE=phases: the profiled run, then SWEEPS (sweeps.sh's syntax). MODE=tests: the GPU tests
# (GPU_K: a -k expression), then the tiny Llama on the Python documentation on the GPU. MODE=lora: the LoRA speed table's 1-GPU rows with energy per token (LORA_ONLY: --only texts).
#   device run (kind nvidia-h200, carry .whl .commit [.devdb]): MODE=doctor bash benchmarks/device/doctor_and_seed_tables.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__)" > "$OUT/versions.txt"
MODE=${MODE:-doctor}
if [ "$MODE" = doctor ]; then
  timeout 240 python3 -m paratrain doctor --recipe recipes/mnist_sample_mobilenetv2.yaml \
    --data-path recipes --out "$OUT" 2>&1 | tee "$OUT/doctor.txt" | tail -40
fi
if [ "$MODE" = doctor ] || [ "$MODE" = phases ]; then
  timeout 150 python3 -m paratrain run recipes/mnist_sample_mobilenetv2.yaml --set launch.nproc=1 \
    --set launch.numa_affinity=node --set train.profile_steps=3 --set train.warmup_steps=5 \
    --set train.max_steps=40 --set checkpoint.at_end=false --output-dir /tmp/phases 2>&1 \
    | tee "$OUT/phases_run.txt" | tail -6
  # flat: files in folders under $OUT did not come back (2026-12-01)
  for f in profile.txt phases.png result.json; do cp "/tmp/phases/$f" "$OUT/phases_$f"; done
  SWEEPS="${SWEEPS:-seed_precision:launch.nproc=1}" BUDGET=$((570 - SECONDS)) bash benchmarks/device/sweeps.sh
fi
if [ "$MODE" = tests ]; then  # every GPU test (the one-GPU ones run; two-GPU ones skip)
  timeout 480 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -x ${GPU_K:+-k "$GPU_K"} 2>&1 \
    | tee "$OUT/gpu_tests.txt" | tail -15
  timeout 90 python3 -m paratrain run recipes/tiny_llama_python_docs_cpu.yaml --set device=cuda \
    --set launch.nproc=1 --set train.max_steps=300 --set data.batch_size=32 --output-dir /tmp/pdocs \
    2>&1 | tail -3 | tee "$OUT/python_docs_run.txt"
  cp /tmp/pdocs/result.json "$OUT/python_docs_result.json" 2>/dev/null
fi
if [ "$MODE" = lora ]; then
  [ "${DOCTOR:-0}" = 1 ] && timeout 240 python3 -m paratrain doctor --recipe recipes/mnist_sample_mobilenetv2.yaml \
    --data-path recipes --out "$OUT" > "$OUT/doctor.txt" 2>&1
  flags=""; IFS='|' read -ra texts <<<"${LORA_ONLY:-transformers|compile + chunked loss}"
  for t in "${texts[@]}"; do flags+=" --only '$t'"; done
  BENCH_FLAGS="$flags" SWEEPS="lora_speed:launch.nproc=1" BUDGET=$((570 - SECONDS)) bash benchmarks/device/sweeps.sh
fi
