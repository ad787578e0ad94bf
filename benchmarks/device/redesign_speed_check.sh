#!/usr/bin/env bash
# Issue 32 on one H200: the redesign (one run plan, a Trainer of components) must leave the
# measured speed where it was. Two rows, each run by the commit before the redesign (its src/
# carried as .prev/src: `git archive e4f99b9 src | tar -x -C .prev`) and by this one, in turns
# (before, after, before, after: a drift of the machine shows in both), in one lease:
#   1b     recipes/llama3.2_1b_full_random.yaml: the Llama-3.2-1B shape, full training, bf16
#          autocast over fp32 weights, 8 x 2,048 tokens, compiled, fused AdamW, 30 steps
#   mnv2   recipes/mnist_sample_mobilenetv2_fastest.yaml on one GPU: MobileNetV2, real digits
#          at 500x500, batch 64, the speed sweep's short run (MNV2_STEPS=60, no evaluation; MNV2_WARMUP
#          steps left out: 10, the sweep's 15)
# ROWS picks them ("1b mnv2"), ROUNDS the turns (1: a turn of both rows is ~7 minutes), SIDES the
# order within a turn ("before after"; a second call "after before").
#   device run (kind nvidia-h200, carry .whl .prev .commit):  bash benchmarks/device/redesign_speed_check.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
{ nvidia-smi -L 2>/dev/null; python3 -c "import torch; print('torch', torch.__version__)"; echo "after: commit $PARATRAIN_COMMIT; before: e4f99b9"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
ROWS=${ROWS:-"1b mnv2"}; ROUNDS=${ROUNDS:-1}; SIDES=${SIDES:-"before after"}
declare -A RECIPE=(
  [1b]="recipes/llama3.2_1b_full_random.yaml"
  [mnv2]="recipes/mnist_sample_mobilenetv2_fastest.yaml --nproc 1 --set train.max_steps=${MNV2_STEPS:-60} --set train.warmup_steps=${MNV2_WARMUP:-10} --set train.eval=false"
)
declare -A SRC=([before]=.prev/src [after]=src)
row() {  # label result.json
  python3 - "$1" "$2" <<'PY' | tee -a "$OUT/rows.txt"
import json, sys
r = json.load(open(sys.argv[2])); s = r["summary"]
rate = f"{s['tokens_per_s']:>10,.0f} tokens/s" if s.get("tokens_per_s") else f"{s['unique_samples_per_s']:>10,.1f} img/s"
mfu = f"  MFU {s['mfu']:.1%}" if s.get("mfu") else ""
print(f"{sys.argv[1]:<16} {rate}  {s['step_time_s']*1000:7.1f} ms/step{mfu}  loss {s['train_loss']:.4f}  peak {s['peak_memory_bytes']/2**30:5.1f} GiB  wall {s['wall_s']:.0f} s")
PY
}
for round in $(seq 1 "$ROUNDS"); do
  for name in $ROWS; do
    for side in $SIDES; do
      tag=${name}_${side}_$round; rm -rf /tmp/$tag
      PYTHONPATH=${SRC[$side]}:/tmp/site timeout 280 python3 -m paratrain run ${RECIPE[$name]} \
        --set log.progress=false --set checkpoint.at_end=false --output-dir /tmp/$tag > /tmp/$tag.log 2>&1 \
        || tail -5 /tmp/$tag.log
      row "$tag" /tmp/$tag/result.json
    done
  done
done
cp /tmp/1b_after_1/result.json "$OUT/1b_after.json" 2>/dev/null
cp /tmp/1b_after_1/plan.json "$OUT/1b_after_plan.json" 2>/dev/null
cp /tmp/mnv2_after_1/result.json "$OUT/mnv2_after.json" 2>/dev/null
grep -h "^paratrain: \|^  [a-z]" /tmp/*_after_1.log > "$OUT/lines.txt" 2>/dev/null
