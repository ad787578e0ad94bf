#!/usr/bin/env bash
# Issue 52 on one GPU (about 6 minutes): calibrate the analytic plan's hardware profile here
# (matmuls bf16 / float8, flash attention, a copy: benchmarks/device/work_kinds_calibrate.py), run
# torchtitan's table again with those rates (`paratrain plan --validate torchtitan-h100` on the
# 500 W H100 with this GPU's derates), then run paratrain's 1B full and 8B LoRA recipes as
# shipped and put each beside the analytic prediction from the measured profile.
# Back (flat, 7 files): measured.toml, measured-500w.toml, measured.json, calibrate.log,
# validate_measured.md, rows_1gpu.md, logs.txt.
#   device run (carry .whl .commit):  bash benchmarks/device/analytic_plan_calibration.sh
set -uo pipefail
BUDGET=${BUDGET:-480}
source "$(dirname "$0")/setup.sh"  # wheels, paths, machine.txt
python3 benchmarks/device/work_kinds_calibrate.py measure "$OUT" 2>&1 | tee "$OUT/calibrate.log"
python3 -m paratrain plan --validate torchtitan-h100 --hardware "$OUT/measured-500w.toml" --terms \
  > "$OUT/validate_measured.md" 2>&1
runs=()
for r in ${RECIPES:-llama3.2_1b_full_random llama3_8b_lora_random}; do
  left=$((BUDGET - (SECONDS - start)))
  [ $left -gt 60 ] || { echo "budget spent before $r"; break; }
  timeout -k 15 $left python3 -m paratrain run "recipes/$r.yaml" --output-dir "/tmp/runs/$r" \
    > "/tmp/run_$r.log" 2>&1 && runs+=("/tmp/runs/$r")
  tail -3 "/tmp/run_$r.log"
done
python3 benchmarks/device/work_kinds_calibrate.py compare "$OUT" "${runs[@]}"
{ cat /tmp/machine.txt; for f in /tmp/run_*.log; do echo "== $f"; grep -aiE "error|Traceback|tokens/s|plan" "$f" | tail -12; done; } > "$OUT/logs.txt" 2>/dev/null
