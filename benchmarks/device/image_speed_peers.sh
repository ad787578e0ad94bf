#!/usr/bin/env bash
# Issue 3, device call B: the speed sweep (paratrain seed-style and fastest vs plain PyTorch,
# HF Accelerate, Lightning Fabric, speed of light) on 1 and 2 GPUs, appended to call A's results.
#   device run (kind nvidia-h200-x2, carry .whl and .commit): bash benchmarks/device/image_speed_peers.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
cp benchmarks/results/2026-11-30-h200x2/issue3/results.db "$OUT/results.db"
python3 -m paratrain bench recipes/bench/speed.yaml --db "$OUT/results.db" --runs-dir /tmp/runs --no-progress \
  2>&1 | tee "$OUT/bench_speed.log"
python3 -m paratrain report --db "$OUT/results.db" --out "$OUT/report.md" --plot "$OUT/plots"
grep -A20 "Configurations and peers" "$OUT/report.md"
for f in /tmp/runs/speed/*/log.txt; do echo "== $f"; grep -iE "error|Traceback" "$f" | tail -3; done > "$OUT/errors.txt"
