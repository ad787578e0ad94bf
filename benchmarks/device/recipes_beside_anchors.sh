#!/usr/bin/env bash
# Issue 53 on one GPU: the recipes as shipped (every speed lever the plan's, `levers: auto`)
# beside their anchors, each ratio from the same call. MODE is one or more of, in this order:
#   lora:   8B LoRA (recipes/bench/lora_speed.yaml): transformers + peft eager, with each decoder
#           layer compiled, with Liger; paratrain as shipped in bf16 and with model.fp8=delayed
#           (its one opt-in flag); ONLY_LORA adds or replaces rows ("=label" picks one exactly),
#           REF_LORA the reference, PAIRS_LORA the label pairs whose losses are laid together;
#   images: MobileNetV2 at 500 px (recipes/bench/speed.yaml, one GPU): the seed-style script,
#           recipes/mnist_sample_mobilenetv2_fastest.yaml as shipped ("paratrain fastest") and
#           the fastest hand-flagged row of issue 34 (row B: Triton at stride 2 everywhere);
#   full:   the 1B shape's full training (recipes/bench/full_speed.yaml): torchtitan 0.2.2 bf16
#           and float8 tensorwise, paratrain as shipped and with model.fp8=delayed.
# Back: rows.md (each mode's table against its anchor), results_<mode>.db, bench_<mode>.log,
# plans.txt (each paratrain run's plan lines: what the plan chose and why), logs.txt (the
# machine and the runs' errors). At most 8 files come back from a call.
#   device run (carry .whl .commit):  MODE="lora images" bash benchmarks/device/recipes_beside_anchors.sh
set -uo pipefail
BUDGET=${BUDGET:-560}
source "$(dirname "$0")/setup.sh"  # wheels, paths, machine.txt
# a warm machine keeps /tmp between calls: this call's tables, DBs, plans and logs hold this
# call's runs only
rm -rf /tmp/rows_*.md /tmp/results_*.db /tmp/runs
if [ -n "${TESTS:-}" ]; then  # TESTS="<pytest -k expression>": those GPU tests first
  timeout ${TESTS_TIMEOUT:-120} python3 -m pytest -q -rA --show-capture=no -m gpu ${TESTS_PATH:-tests/gpu} -k "$TESTS" -p no:cacheprovider -p no:benchmark 2>&1 | tee "$OUT/gpu_tests.txt" | tail -8
fi
bench() {  # bench <mode> <sweep> <reference> <default rows> [pairs...]
  local mode=$1 sweep=$2 ref=$3 rows=$4; shift 4
  local var="ONLY_${mode^^}"; eval "only=(${!var:-$rows})"; local flags=()
  for o in "${only[@]}"; do flags+=(--only "$o"); done
  local left=$((BUDGET - (SECONDS - start)))
  [ $left -gt 60 ] || { echo "budget spent before $mode"; return; }
  timeout -k 15 $left python3 -m paratrain bench "recipes/bench/$sweep.yaml" --grid launch.nproc=1 \
    "${flags[@]}" ${BENCH_FLAGS:-} --db /tmp/results_$mode.db --runs-dir /tmp/runs --no-progress \
    2>&1 | tee "$OUT/bench_$mode.log" | tail -12
  python3 benchmarks/device/pair_rows.py /tmp/results_$mode.db "/tmp/rows_$mode.md" "$ref" "$@"
}
for mode in ${MODE:-lora images full}; do
case $mode in
lora)  # REF_LORA and PAIRS_LORA ('"A=B" ...') replace the reference and the loss pairs
  pairs='"transformers + peft, compiled=transformers + peft" "transformers + peft + Liger=transformers + peft" "paratrain as shipped=transformers + peft" "paratrain as shipped + model.fp8=delayed=transformers + peft"'
  eval "pairs=(${PAIRS_LORA:-$pairs})"
  bench lora lora_speed "${REF_LORA:-transformers + peft}" \
    '"=transformers + peft" "=transformers + peft, compiled" "=transformers + peft + Liger" "=paratrain as shipped" "=paratrain as shipped + model.fp8=delayed"' \
    "${pairs[@]}"
  ;;
images)
  bench images speed "plain PyTorch (seed style)" \
    '"=plain PyTorch (seed style)" "=paratrain fastest" "=paratrain fastest, Triton depthwise (stride 2 everywhere) + stem + BatchNorm, fused AdamW"'
  ;;
full)
  bench full full_speed "torchtitan compiled" \
    '"=torchtitan compiled" "=paratrain as shipped" "=torchtitan compiled + fp8 tensorwise" "=paratrain as shipped + model.fp8=delayed"' \
    "paratrain as shipped=torchtitan compiled" \
    "paratrain as shipped + model.fp8=delayed=torchtitan compiled + fp8 tensorwise"
  ;;
esac
done
for db in /tmp/results_*.db; do
  [ -e "$db" ] || continue
  python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" $db "$OUT/$(basename $db)"
done
for f in /tmp/rows_*.md; do [ -e "$f" ] && { echo "## $(basename $f .md)"; cat "$f"; echo; }; done > "$OUT/rows.md"
for f in /tmp/runs/*/*/log.txt; do
  grep -q "paratrain: plan" "$f" 2>/dev/null || continue
  echo "== $f"; grep -aE "^  (layout|precision|lever|plain|levers|hint|note) " "$f"
done > "$OUT/plans.txt"
{ cat /tmp/machine.txt
for f in /tmp/runs/*/*/log.txt /tmp/runs/*/*/torchtitan.log; do
  [ -e "$f" ] || continue
  echo "== $f"; grep -aiE "error|Traceback|tokens/s|samples/s|warn|unsloth" "$f" | tail -12
done; } > "$OUT/logs.txt" 2>/dev/null
