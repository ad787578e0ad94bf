#!/usr/bin/env bash
# Issue 14 on one H200 (2026-12-01): (1) chaos trials over NCCL: one worker under torchrun killed
# with SIGKILL at a random step, restarted by the agent, resumed from the newest checkpoint, and
# compared bit for bit with an uninterrupted run; a damaged newest checkpoint skipped. (2) What
# the non-finite guard costs (one all-reduce of a flag and one host sync per step): a Llama-3.2-1B
# shaped model, bf16, full training, tokens/s with train.max_bad_steps=3 (the default) and -1
# (no check), side by side, twice each in alternation.
#   device run (kind nvidia-h200, carry .whl .commit):  bash benchmarks/device/chaos_nccl.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
DEV=${DEV:-cuda}; TRIALS=${TRIALS:-5}; SHAPE=${SHAPE:-llama3.2-1b}; STEPS=${STEPS:-40}
{ nvidia-smi -L 2>/dev/null; python3 -c "import torch; print('torch', torch.__version__)"; echo "commit $PARATRAIN_COMMIT"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
timeout 330 python3 benchmarks/chaos/kill_resume.py --device $DEV --trials $TRIALS --corrupt-trials 2 --out "$OUT/chaos_gpu.md" 2>&1 | tail -12
C="--set data.source=synthetic-text --set model.init=random --set model.shape=$SHAPE --set device=$DEV --set data.num_workers=0 --set data.max_length=512 --set data.batch_size=8 --set train.max_steps=$STEPS --set train.warmup_steps=10 --set log.progress=false --set lora.enabled=false --set precision=bf16 --set checkpoint.at_end=false"
for round in 1 2; do
  for guard in 3 -1; do
    timeout 150 python3 -m paratrain run $C --set train.max_bad_steps=$guard --output-dir /tmp/g_${guard}_$round > /tmp/g.log 2>&1 || tail -3 /tmp/g.log
    python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['summary']; print(f'max_bad_steps={sys.argv[2]:>2} round {sys.argv[3]}: {s[\"tokens_per_s\"]:,.0f} tokens/s, {s[\"step_time_s\"]*1000:.1f} ms/step, skipped {s[\"skipped_steps\"]}')" /tmp/g_${guard}_$round/result.json $guard $round 2>&1 | tee -a "$OUT/guard_cost.txt"
  done
done
