#!/usr/bin/env bash
# Issue 61 item 3 on one GPU (about 9 minutes): the memory the caching allocator holds
# (torch.cuda.max_memory_reserved) and the tensors' own peak (max_memory_allocated) of paratrain's
# 1B full and 8B LoRA recipes at several batch sizes, sequence lengths and AC modes, each beside
# the analytic forecast (`paratrain plan --hardware h100-sxm`); the two recipes as shipped first
# (their throughput beside the forecast too). Runs are cut to 12 steps except the shipped two.
# Back (flat): memory.md, memory.json, runs.txt, machine.txt, profile_1b_b8.txt,
# profile_8b_lora_b2.txt (3 profiled steps after warm-up, out of the throughput; each
# with trace_gaps.py's idle time appended). RUNS replaces the runs ("label|recipe|overrides" a
# line), PROFILES the labels whose profile comes back (theirs set train.profile_steps).
#   device run (carry .whl .commit):  bash benchmarks/device/forecast_memory.sh
set -uo pipefail
BUDGET=${BUDGET:-560}
source "$(dirname "$0")/setup.sh"  # wheels, paths, machine.txt
short="--set train.max_steps=12 --set train.warmup_steps=4"
# label|recipe|overrides
RUNS=${RUNS:-"1b_b8|llama3.2_1b_full_random|--set train.profile_steps=3 --set train.floor=true
8b_lora_b2|llama3_8b_lora_random|--set train.profile_steps=3 --set train.floor=true
1b_b8_flash|llama3.2_1b_full_random|--set train.sdpa_backend=flash $short
1b_b4|llama3.2_1b_full_random|--set data.batch_size=4 $short
1b_b12|llama3.2_1b_full_random|--set data.batch_size=12 $short
8b_lora_b4|llama3_8b_lora_random|--set data.batch_size=4 $short
1b_s4096_b4|llama3.2_1b_full_random|--set data.max_length=4096 --set data.batch_size=4 $short
1b_b16_ac|llama3.2_1b_full_random|--set data.batch_size=16 --set train.activation_checkpointing=true $short
8b_lora_b1|llama3_8b_lora_random|--set data.batch_size=1 $short"}
done_runs=()
while IFS='|' read -r label recipe over; do
  [ -n "$label" ] || continue
  left=$((BUDGET - (SECONDS - start)))
  [ $left -gt 75 ] || { echo "budget spent before $label"; break; }
  # shellcheck disable=SC2086
  timeout -k 15 $((left - 10)) python3 -m paratrain run "recipes/$recipe.yaml" $over \
    --output-dir "/tmp/runs/$label" > "/tmp/run_$label.log" 2>&1 && done_runs+=("$label|$recipe|$over")
  echo "== $label ($((SECONDS - start)) s)"; tail -2 "/tmp/run_$label.log"
done <<< "$RUNS"
printf '%s\n' "${done_runs[@]}" > /tmp/done.txt
python3 benchmarks/device/forecast_memory.py /tmp/runs /tmp/done.txt "$OUT"
cp /tmp/machine.txt "$OUT/"
# each profile with where its GPU sat idle (trace_gaps.py) appended: 8 files come back at most
for p in ${PROFILES:-1b_b8 8b_lora_b2}; do  # PROFILES: the labels whose runs profile
  { cat "/tmp/runs/$p/profile.txt"; echo; echo "== trace_gaps.py"
    python3 benchmarks/device/trace_gaps.py "/tmp/runs/$p/trace.json.gz" --steps 3; } \
    > "$OUT/profile_$p.txt" 2>&1
done
{ for f in /tmp/run_*.log; do echo "== $f"; grep -aiE "error|Traceback|tokens/s|peak memory" "$f" | tail -6; done; } > "$OUT/runs.txt" 2>/dev/null
