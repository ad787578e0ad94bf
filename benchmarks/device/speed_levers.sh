#!/usr/bin/env bash
# Issue 34 on one H200; MODE is one or more of these, run in one device call:
#   MODE=lora: LoRA on the Llama-3 8B shape (recipes/bench/lora_speed.yaml, one GPU): transformers
#     + peft, + Liger, paratrain compiled in bf16 and float8 tensorwise (ONLY="<label texts>");
#   MODE=layers: each MobileNetV2 depthwise layer and each distinct BatchNorm layer alone
#     (depthwise.json, batchnorm.json): cuDNN, inductor, paratrain's Triton kernels, each as wall
#     time and as the GPU's kernel time (benchmarks/device/layer_timing.py); the stem convolution
#     (1 -> 32 channels) as cuDNN, compiled and shift-add (stem.json);
#   MODE=colsums: the Triton BatchNorm's column sums per layer for each grid / loop / block choice
#     (colsums.json; benchmarks/device/colsums_sweep.py);
#   MODE=dwsweep: the Triton depthwise kernels (and the stem) kernel by kernel for each block size
#     and warps, cuDNN beside them (dwsweep.json; benchmarks/device/dw_sweep.py);
#   MODE=images: MobileNetV2 at 500x500 (recipes/bench/speed.yaml, one GPU): the seed-style
#     script and paratrain's fastest rows (ONLY_IMAGES="<label texts>");
#   MODE=profile: PROFILES="name:recipe:k=v,k=v ...", each a paratrain run with 3 steps profiled
#     (profile_<name>.txt, its trace and where the GPU sat idle: trace_<name>.json.gz, gaps_<name>.txt);
#   MODE=full: full training of the Llama-3.2-1B shape (recipes/bench/full_speed.yaml): torchtitan
#     (its own Trainer and launch through paratrain's peer) beside paratrain, bf16 and float8
#     tensorwise, gradients clipped to 1.0 in both; ONLY="<label texts>" picks rows;
#     PROFILE="<paratrain --set args>" first profiles one paratrain row (profile.txt back).
# ONLY_LORA / ONLY_FULL pick rows for one mode when MODE names both; "=label" picks one row exactly.
# Back per mode: bench_<mode>.log, results_<mode>.db; rows.md (each mode's table), logs.txt (the
# machine, the runs' and torchtitan's logs): at most 8 files come back from a call.
# Wheels the machine lacks are carried: .whl/*.whl (pydantic, torchao, liger...) and .whl/tt/
# (torchtitan 0.2.2 and what it imports: torchdata, tyro, tomli, einops).
# TESTS="<pytest -k expression>" runs those GPU tests first (gpu_tests.txt back, each test's
# name and outcome listed: -rA), from TESTS_PATH (default tests/gpu: the expression applies to
# every file there), within TESTS_TIMEOUT seconds (240).
#   device run (kind nvidia-h200, carry .whl .commit):  MODE=full bash benchmarks/device/speed_levers.sh
set -uo pipefail
BUDGET=${BUDGET:-540}
source "$(dirname "$0")/setup.sh"  # wheels, paths, machine.txt
if [ -n "${TESTS:-}" ]; then  # TESTS="<pytest -k expression>": those GPU tests first
  timeout ${TESTS_TIMEOUT:-240} python3 -m pytest -q -rA --show-capture=no -m gpu ${TESTS_PATH:-tests/gpu} -k "$TESTS" -p no:cacheprovider -p no:benchmark 2>&1 | tee "$OUT/gpu_tests.txt" | tail -8
fi
for mode in ${MODE:-full}; do  # MODE="lora profile": both, in this order
  DB=/tmp/results_$mode.db  # one per mode: rows_<mode>.md compares a mode's rows only
case $mode in
full)
  if [ -n "${PROFILE:-}" ]; then
    args=(); for s in $PROFILE; do args+=(--set "$s"); done
    timeout 240 python3 -m paratrain run recipes/llama3.2_1b_full_random.yaml "${args[@]}" --set train.profile_steps=3 --set log.progress=false --output-dir /tmp/profile 2>&1 | tail -3
    cp /tmp/profile/profile.txt "$OUT/profile.txt"
  fi
  eval "only=(${ONLY_FULL:-${ONLY:-torchtitan \"paratrain compiled\"}})"; flags=()
  for o in "${only[@]}"; do flags+=(--only "$o"); done
  left=$((BUDGET - (SECONDS - start)))
  timeout -k 15 $left python3 -m paratrain bench recipes/bench/full_speed.yaml "${flags[@]}" ${BENCH_FLAGS:-} \
    --db $DB --runs-dir /tmp/runs --no-progress 2>&1 | tee "$OUT/bench_$mode.log" | tail -20
  python3 benchmarks/device/pair_rows.py $DB "/tmp/rows_$mode.md" "${REF_FULL:-torchtitan compiled}" \
    "paratrain compiled=torchtitan compiled" \
    "paratrain compiled + fp8 tensorwise=torchtitan compiled + fp8 tensorwise" \
    "paratrain compiled + fp8 tensorwise + float8 lm_head=torchtitan compiled + fp8 tensorwise" \
    "paratrain compiled + fp8 delayed=torchtitan compiled + fp8 tensorwise" \
    "paratrain compiled + fp8 delayed + float8 lm_head=torchtitan compiled + fp8 tensorwise"
  ;;
layers)  # each MobileNetV2 depthwise and BatchNorm layer alone, forward + backward; the stem
  timeout 120 python3 benchmarks/device/stem_layer.py "$OUT/stem.json" 2>&1 | tail -6
  timeout 240 python3 benchmarks/device/depthwise_layers.py "$OUT/depthwise.json" 2>&1 | tail -20
  left=$((BUDGET - (SECONDS - start)))
  timeout $left python3 benchmarks/device/batchnorm_layers.py "$OUT/batchnorm.json" 2>&1 | tail -22
  ;;
colsums)  # the Triton BatchNorm's column sums alone, per layer, for several grids / unrollings
  left=$((BUDGET - (SECONDS - start)))
  timeout $left python3 benchmarks/device/colsums_sweep.py "$OUT/colsums.json" 2>&1 | tail -40
  ;;
dwsweep)  # the Triton depthwise kernels alone, per layer, for several blocks and warps
  left=$((BUDGET - (SECONDS - start)))
  timeout $left python3 benchmarks/device/dw_sweep.py "$OUT/dwsweep.json" 2>&1 | tail -14
  ;;
images)  # MobileNetV2 at 500x500 (recipes/bench/speed.yaml, one GPU): the seed-style script
  # beside paratrain's fastest rows (shift-add / Triton depthwise, Triton BatchNorm)
  eval "only=(${ONLY_IMAGES:-\"plain PyTorch (seed style)\" \"paratrain fastest\"})"; flags=()
  for o in "${only[@]}"; do flags+=(--only "$o"); done
  left=$((BUDGET - (SECONDS - start)))
  timeout -k 15 $left python3 -m paratrain bench recipes/bench/speed.yaml --grid launch.nproc=1 \
    "${flags[@]}" ${BENCH_FLAGS:-} --db $DB --runs-dir /tmp/runs --no-progress 2>&1 | tee "$OUT/bench_$mode.log" | tail -20
  python3 benchmarks/device/pair_rows.py $DB "/tmp/rows_$mode.md" "plain PyTorch (seed style)"
  ;;
profile)  # PROFILES="name:recipe:k=v,k=v name2:...": each run profiled (profile_<name>.txt back)
  for entry in ${PROFILES:-}; do
    IFS=: read -r name recipe sets <<<"$entry"; args=()
    for kv in ${sets//,/ }; do args+=(--set "$kv"); done
    left=$((BUDGET - (SECONDS - start))); [ $left -gt 60 ] || { echo "budget spent before $name"; break; }
    timeout $left python3 -m paratrain run "$recipe" "${args[@]}" --set train.profile_steps=3 --set log.progress=false --output-dir /tmp/prof_$name 2>&1 | grep "^paratrain: " | head -2 | tee -a "$OUT/profiled_runs.txt"
    cp /tmp/prof_$name/profile.txt "$OUT/profile_$name.txt"
    # where the GPU waits (benchmarks/device/trace_gaps.py reads it here or back home)
    cp /tmp/prof_$name/trace.json.gz "$OUT/trace_$name.json.gz" 2>/dev/null
    python3 benchmarks/device/trace_gaps.py /tmp/prof_$name/trace.json.gz 2>&1 | tail -25 | tee "$OUT/gaps_$name.txt"
  done
  ;;
lora)
  eval "only=(${ONLY_LORA:-${ONLY:-\"transformers + peft\" \"paratrain compiled,\"}})"; flags=()
  for o in "${only[@]}"; do flags+=(--only "$o"); done
  left=$((BUDGET - (SECONDS - start)))
  timeout -k 15 $left python3 -m paratrain bench recipes/bench/lora_speed.yaml --grid launch.nproc=1 \
    "${flags[@]}" ${BENCH_FLAGS:-} \
    --db $DB --runs-dir /tmp/runs --no-progress 2>&1 | tee "$OUT/bench_$mode.log" | tail -20
  python3 benchmarks/device/pair_rows.py $DB "/tmp/rows_$mode.md" "transformers + peft" \
    "paratrain compiled, bf16=transformers + peft" \
    "paratrain compiled, fp8 tensorwise=transformers + peft" \
    "paratrain compiled + fused AdamW, bf16=transformers + peft" \
    "paratrain compiled + fused AdamW, fp8 tensorwise=transformers + peft" \
    "paratrain compiled + fused AdamW + CUDA graphs, bf16=transformers + peft" \
    "paratrain compiled + fused AdamW + CUDA graphs, fp8 tensorwise=transformers + peft" \
    "paratrain compiled + fused AdamW, fp8 rowwise=transformers + peft" \
    "paratrain compiled + fused AdamW, fp8 tensorwise + float8 lm_head=transformers + peft" \
    "paratrain compiled + fused AdamW, fp8 delayed=transformers + peft" \
    "paratrain compiled + fused AdamW, fp8 delayed + float8 lm_head=transformers + peft" \
    "paratrain compiled + fused AdamW + CUDA graphs, fp8 delayed + float8 lm_head=transformers + peft" \
    "paratrain compiled + fused AdamW, fp8 delayed + float8 lm_head + coordinate descent=transformers + peft" \
    "paratrain compiled max-autotune + fused AdamW, fp8 delayed + float8 lm_head=transformers + peft" \
    "paratrain compiled max-autotune + fused AdamW, bf16=transformers + peft" \
    "transformers + peft + Liger=transformers + peft"
  ;;
esac
done
for db in /tmp/results_*.db; do
  [ -e "$db" ] || continue  # MODE=profile alone keeps none
  python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" $db "$OUT/$(basename $db)"
done
for f in /tmp/rows_*.md; do [ -e "$f" ] && { echo "## $(basename $f .md)"; cat "$f"; echo; }; done > "$OUT/rows.md"
{ cat /tmp/machine.txt
for f in /tmp/runs/*/*/torchtitan.log; do echo "== $f"; grep -aE "step:|Error|error|float8|Float8|compil|stubbed" "$f" | tail -12; done
for f in /tmp/runs/*/*/log.txt; do echo "== $f"; grep -aiE "error|Traceback|tokens/s|warn" "$f" | tail -6; done; } > "$OUT/logs.txt" 2>/dev/null
