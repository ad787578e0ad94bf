#!/usr/bin/env bash
# Issue 51 on one GPU: the recipes as shipped, before issue 51's changes (BEFORE, default
# d1778f8: main just before its first merge; its src carried in .before/src) and after (this
# checkout), in A-B-B-A order so that drift in the GPU's clock or the inductor cache falls on
# both sides alike. MODE: one or more of full (1B full, recipes/bench/full_speed.yaml), lora
# (8B LoRA, lora_speed.yaml), images (MobileNetV2 at 500 px, speed.yaml "paratrain fastest").
# SIDES: the runs' order (default before after after before). TESTS: a pytest -k expression over TESTS_PATH, run first. Back: ab.md (each run's rate, step
# time and last loss; the after/before ratio of each workload), results_dbs.tar.gz (each run's DB), bench logs.
#   here:   rm -rf .before && mkdir .before && git archive d1778f8 src | tar -x -C .before
#   device run (carry .whl .commit .before):  MODE="full lora" bash benchmarks/device/recipes_before_after.sh
set -uo pipefail
BUDGET=${BUDGET:-560}
source "$(dirname "$0")/setup.sh"  # wheels, paths, machine.txt
[ -d .before/src/paratrain ] || { echo "no .before/src: make it with git archive (see the header)"; exit 2; }
if [ -n "${TESTS:-}" ]; then
  timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -q -rA --show-capture=no -m gpu ${TESTS_PATH:-tests/gpu/test_gpu.py} \
    -k "$TESTS" -p no:cacheprovider -p no:benchmark 2>&1 | tee "$OUT/gpu_tests.txt" | tail -12
fi
after_path=$PYTHONPATH; before_path=$PWD/.before/src:/tmp/site
one() {  # one <mode> <side> <n> <sweep> <label>
  local mode=$1 side=$2 n=$3 sweep=$4 label=$5 left=$((BUDGET - (SECONDS - start)))
  [ $left -gt 45 ] || { echo "budget spent before $mode $side $n"; return; }
  local path=$after_path; [ "$side" = before ] && path=$before_path
  PYTHONPATH=$path timeout -k 15 $left python3 -m paratrain bench "recipes/bench/$sweep.yaml" \
    --grid launch.nproc=1 --only "=$label" --db "/tmp/results_${mode}_${side}_$n.db" \
    --runs-dir "/tmp/runs_${mode}_${side}_$n" --no-progress 2>&1 | tail -2 | tee -a "$OUT/bench_$mode.log"
}
for mode in ${MODE:-full lora images}; do
  case $mode in
    full) sweep=full_speed label="paratrain as shipped" ;;
    lora) sweep=lora_speed label="paratrain as shipped" ;;
    images) sweep=speed label="paratrain fastest" ;;
  esac
  n=0
  for side in ${SIDES:-before after after before}; do  # SIDES: another order, or one side again
    n=$((n + 1)); one $mode $side $n $sweep "$label"
  done
done
python3 - "$OUT/ab.md" /tmp/results_*.db <<'PY'
import json, sqlite3, statistics, sys
from collections import defaultdict
rows, rates = [], defaultdict(list)
for path in sys.argv[2:]:
    mode, side, n = path.rsplit("/", 1)[1][len("results_"):-3].split("_")
    for status, m, r, commit in sqlite3.connect(path).execute(
            "select status, metrics, result, git_commit from runs"):
        m, r = json.loads(m or "{}") or {}, json.loads(r or "{}") or {}
        rate = m.get("tokens_per_s") or m.get("unique_samples_per_s")
        curve = r.get("curve") or [[None, None]]
        rows.append((mode, side, n, status, rate, m.get("step_time_s"), f"{curve[-1][1]} (step {curve[-1][0]})"))
        if status == "ok" and rate:
            rates[mode, side].append(rate)
out = ["| workload | side | run | status | tokens/s (img/s) | s/step | last loss |", "|---|---|---:|---|---:|---:|---:|"]
out += [f"| {a} | {b} | {c} | {d} | {e or 0:,.0f} | {f or 0:.4f} | {g} |" for a, b, c, d, e, f, g in sorted(rows)]
out += ["", "| workload | before (median) | after (median) | after / before |", "|---|---:|---:|---:|"]
for mode in sorted({k[0] for k in rates}):
    b, a = rates.get((mode, "before")), rates.get((mode, "after"))
    if a and b:
        out.append(f"| {mode} | {statistics.median(b):,.0f} | {statistics.median(a):,.0f} | {statistics.median(a) / statistics.median(b):.3f} |")
open(sys.argv[1], "w").write("\n".join(out) + "\n"); print("\n".join(out))
PY
tar -czf "$OUT/results_dbs.tar.gz" -C /tmp $(cd /tmp && ls results_*.db)  # a call returns at most 8 files
cp /tmp/machine.txt "$OUT/"
