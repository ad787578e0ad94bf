#!/usr/bin/env bash
# Issue 4's target on the lent 2xH200 machine: Llama3-8B-shaped LoRA (random init, bf16, r=8 on
# q/v/o, batch 2 x 2,048 per GPU): plain transformers + peft vs paratrain (ddp-ds, fsdp, chunked
# loss), 1 and 2 GPUs. Then issue 3's untried levers on 1 GPU if SWEEPS names speed_levers.
#   device run (kind nvidia-h200-x2, carry .whl and .commit): bash benchmarks/device/issue4_lora_speed.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
for sweep in ${SWEEPS:-lora_speed}; do
  python3 -m paratrain bench recipes/bench/$sweep.yaml --db "$OUT/results.db" --runs-dir /tmp/runs --no-progress
done 2>&1 | tee "$OUT/bench.log"
python3 -m paratrain report --db "$OUT/results.db" --out "$OUT/report.md"
cat "$OUT/report.md" | head -60
