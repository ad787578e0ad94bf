#!/usr/bin/env bash
# Issue 18 on one GPU.
# MODE=tune: `paratrain tune` on the seed-style MobileNetV2 recipe (500x500, batch 64 held:
# --keep data.batch_size) within BUDGET seconds; the trials DB is seeded from .devdb/tune.db and
# comes back as tune.db, so the next call resumes the search where this one stopped.
# COMPARE=1 (after MODE=tune) or MODE=finish: the tuned recipe (this call's, or .devdb/tuned.yaml)
# and the hand-found fastest recipe, each 60 steps, in this call. MODE=finish then runs `paratrain plan` of the 1B Llama shape (calibrated here, the link
# stated: 2 GPUs' NCCL all-reduce of an earlier lease, an assumed inter-node figure).
# MODE=lora: the same for the Llama-3 8B LoRA shape in bf16 (see below).
#   device run (kind nvidia-h200, carry .whl .commit .devdb): MODE=tune bash benchmarks/device/tune_and_plan.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0))" > "$OUT/versions.txt"
MODE=${MODE:-tune}
if [ "$MODE" = tune ]; then
  cp .devdb/tune.db /tmp/tune.db 2>/dev/null || true
  timeout $((${BUDGET:-540} + 60)) python3 -m paratrain tune recipes/mnist_sample_mobilenetv2.yaml \
    --keep data.batch_size --budget "${BUDGET:-540}s" --steps 30 --set train.warmup_steps=10 \
    --db /tmp/tune.db --out /tmp/tune --no-progress 2>&1 | tee "$OUT/tune.txt" | tail -40
  cp /tmp/tune.db "$OUT/tune.db"
  for f in tune.json tuned.yaml; do cp "/tmp/tune/$f" "$OUT/$f" 2>/dev/null; done
fi
if [ "$MODE" = finish ] || { [ "$MODE" = tune ] && [ "${COMPARE:-0}" = 1 ]; }; then  # COMPARE=1: after MODE=tune, its tuned.yaml
  tuned=.devdb/tuned.yaml; [ "${COMPARE:-0}" = 1 ] && tuned=/tmp/tune/tuned.yaml
  common=(--set launch.nproc=1 --set train.max_steps=60 --set train.warmup_steps=15
          --set train.eval=false --set checkpoint.at_end=false --set log.progress=false)
  for r in "$tuned" recipes/mnist_sample_mobilenetv2_fastest.yaml; do
    name=$(basename "$r" .yaml)
    timeout 200 python3 -m paratrain run "$r" "${common[@]}" --output-dir "/tmp/$name" 2>&1 | tail -2 \
      | tee -a "$OUT/compare.txt"
    cp "/tmp/$name/result.json" "$OUT/compare_$name.json" 2>/dev/null
  done
fi
if [ "$MODE" = lora ]; then
  # The Llama-3 8B LoRA shape, bf16 rediscovery: batch, precision and float8 held (the hand-found
  # bf16 best is compile + Liger's fused loss, 17,364 tokens/s on 2026-11-30). The DB comes and
  # goes as for MODE=tune (.devdb/tune_lora.db). COMPARE=1: then the tuned recipe, the hand-found
  # bf16 set-up and the recipe itself, 45 steps each (15 of warm-up), in this call.
  cp .devdb/tune_lora.db /tmp/tune_lora.db 2>/dev/null || true
  if [ "${BUDGET:-540}" -gt 0 ]; then
    timeout $((${BUDGET:-540} + 150)) python3 -m paratrain tune recipes/llama3_8b_lora_random.yaml \
      --keep data.batch_size --keep precision --keep model.fp8 --budget "${BUDGET:-540}s" \
      --steps 20 --set train.warmup_steps=5 --trial-timeout 240 --db /tmp/tune_lora.db --out /tmp/tune_lora \
      --no-progress 2>&1 | tee "$OUT/tune_lora.txt" | tail -40
    cp /tmp/tune_lora.db "$OUT/tune_lora.db"
    cp /tmp/tune_lora/tune.json "$OUT/tune_lora.json" 2>/dev/null
    cp /tmp/tune_lora/tuned.yaml "$OUT/tuned_lora.yaml" 2>/dev/null
  fi
  if [ "${COMPARE:-0}" = 1 ]; then
    tuned=/tmp/tune_lora/tuned.yaml; [ -f "$tuned" ] || tuned=.devdb/tuned_lora.yaml
    common=(--set train.max_steps=45 --set train.warmup_steps=15 --set log.progress=false)
    r=recipes/llama3_8b_lora_random.yaml
    for spec in "tuned|$tuned" "hand|$r --set train.compile=true --set model.kernels=liger-loss" "recipe|$r"; do
      name=${spec%%|*}; args=${spec#*|}
      # shellcheck disable=SC2086
      timeout 240 python3 -m paratrain run $args "${common[@]}" --output-dir "/tmp/cmp_$name" 2>&1 \
        | tail -2 | sed "s/^/$name: /" | tee -a "$OUT/compare_lora.txt"
      cp "/tmp/cmp_$name/result.json" "$OUT/compare_lora_$name.json" 2>/dev/null
    done
  fi
fi
if [ "$MODE" = finish ] || [ "$MODE" = plan ]; then  # MODE=plan: the plan alone
  timeout $((570 - SECONDS)) python3 -m paratrain plan recipes/llama3.2_1b_full_random.yaml \
    --gpus 1,2,4,8,64 --bus-gbps 242 --inter-node-gbps 45 --measure 1 --steps 20 \
    --strategies ddp,fsdp,hsdp,tp,pp --set train.compile=false --out /tmp/plan 2>&1 | tee "$OUT/plan.txt" | tail -40
  cp /tmp/plan/plan.json "$OUT/plan.json" 2>/dev/null
fi
