#!/usr/bin/env bash
# Issue 20 on one H200: each case study, paratrain beside the plain loop of the same case, in
# one lease. MODE picks a call (each fits the 10-minute limit):
#   images  ResNet-50 with the seed's set-up (fp32, SGD lr 0.01, batch 32) against the plain
#           seed-style DDP script (peers/plain.py), and both in bf16, paratrain with its levers;
#           the GAN (DCGAN, bf16, batch 128) against plain_gan.py; then the quality run: an
#           MNIST classifier trained by paratrain, the GAN 10 epochs scored on it, the last
#           epoch's sample grid back as gan_samples.png
#   gpt2    GPT-2 124M trained in full (bf16 autocast, fp32 weights, 8 x 1,024 tokens) against
#           the plain transformers loop (peers/hf_lora.py, lora off), eager and compiled; then
#           gpt2_python_docs.yaml (real text, 200 steps, held-out loss)
#   bert    BERT-base masked LM (bf16, 32 x 512 tokens) against the plain transformers loop with
#           DataCollatorForLanguageModeling (peers/hf_bert.py), eager and compiled; then
#           bert_mlm_python_docs.yaml (real text, 200 steps)
#   parallel GPT-2 under tensor and pipeline parallelism as CPU processes (gloo) on this
#           machine's torch (2.11; CI runs the same tests on 2.14); GPT-2 124M through the
#           tensor-parallel code on the one GPU (strategy=tp over a one-rank mesh: DTensor
#           weights, the q/k/v gather, loss_parallel) beside the same run without; then
#           bert_mlm_python_docs.yaml with 300 warm-up steps at lr 1e-4 and 3e-4, 1,500 steps
#   guard   the NaN guard's flag left on the device (fused optimizers): ResNet-50 bf16 with the
#           levers, foreach SGD (the host check each step) against fused SGD (the flag), with
#           and without the guard, beside the plain bf16 script; a NaN injected at step 30 must
#           be skipped on the GPU; BERT-base compiled (fused AdamW) with and without the guard
#   DOCS_STEPS: the real-text runs' steps (200 by default)
#   device run (kind nvidia-h200, carry .whl .commit):  MODE=images bash benchmarks/device/case_studies.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
DEV=${DEV:-cuda}; MODE=${MODE:-images}; STEPS=${STEPS:-60}
{ nvidia-smi -L 2>/dev/null; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; echo "commit $PARATRAIN_COMMIT"; echo "MODE=$MODE STEPS=$STEPS"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
LIMIT=${LIMIT:-300}
sets() { for s in "$@" ${EXTRA:-}; do printf -- '--set %s ' "$s"; done; }
pt() {  # name recipe|"" settings...: a paratrain run -> /tmp/r_<name>/result.json
  local n=$1 recipe=$2; shift 2
  rm -rf /tmp/r_$n
  timeout $LIMIT python3 -m paratrain run $recipe $(sets "$@") --output-dir /tmp/r_$n > /tmp/r_$n.log 2>&1 || { echo "FAILED $n"; tail -5 /tmp/r_$n.log; }
  grep "^paratrain: " /tmp/r_$n.log | head -2 | tee -a "$OUT/lines.txt"
}
peer() {  # name program recipe settings...: the plain loop on the config paratrain would run
  local n=$1 prog=$2 recipe=$3; shift 3
  python3 -m paratrain run $recipe $(sets "$@") --print-config > /tmp/r_$n.yaml
  rm -rf /tmp/r_$n
  timeout $LIMIT python3 -m paratrain.bench.peers.$prog /tmp/r_$n.yaml /tmp/r_$n > /tmp/r_$n.log 2>&1 || { echo "FAILED $n"; tail -5 /tmp/r_$n.log; }
  grep "^paratrain peer" /tmp/r_$n.log | tee -a "$OUT/lines.txt"
}
table() {  # title name=... : a markdown table into rows.md
  local title=$1; shift
  { echo; echo "### $title"; echo; python3 benchmarks/device/case_rows.py "$@"; } | tee -a "$OUT/rows.md"
}
COMMON="device=$DEV checkpoint.at_end=false train.eval=false log.progress=false train.max_steps=$STEPS train.warmup_steps=10"

if [ "$MODE" = images ]; then
  # ResNet-50 on synthetic grey 224x224 images (the peers draw 1-channel digits), 1,000 classes
  R="recipes/cases/resnet50_seed_sgd.yaml"
  RS="$COMMON strategy=single data.source=synthetic data.synthetic_samples=4096 data.synthetic_size=224 data.channels=1 data.num_classes=1000 data.num_workers=8"
  peer r50_plain_fp32 plain "$R" $RS
  pt r50_fp32 "$R" $RS
  peer r50_plain_bf16 plain "$R" $RS precision=bf16
  LEVERS="precision=bf16 train.channels_last=true train.cudnn_benchmark=true train.compile=true data.prefetch_to_device=true data.persistent_workers=true data.resize_on=gpu"
  pt r50_bf16_levers "$R" $RS $LEVERS
  pt r50_bf16_levers_noguard "$R" $RS $LEVERS train.max_bad_steps=-1
  table "ResNet-50, the seed's SGD set-up, batch 32, 1 H200" "plain seed-style fp32=/tmp/r_r50_plain_fp32/result.json" "paratrain fp32=/tmp/r_r50_fp32/result.json" "plain seed-style bf16=/tmp/r_r50_plain_bf16/result.json" "paratrain bf16 + channels_last + compile + uint8 to the GPU=/tmp/r_r50_bf16_levers/result.json" "the same, NaN guard off=/tmp/r_r50_bf16_levers_noguard/result.json"
  G="recipes/cases/gan_mnist.yaml"
  GS="$COMMON strategy=single train.max_steps=300 train.warmup_steps=20"
  peer gan_plain plain_gan "$G" $GS
  pt gan "$G" $GS
  pt gan_gpu "$G" $GS data.resize_on=gpu data.prefetch_to_device=true
  pt gan_gpu_noguard "$G" $GS data.resize_on=gpu data.prefetch_to_device=true train.max_bad_steps=-1
  table "DCGAN on the MNIST sample, bf16, batch 128, 300 steps, 1 H200" "plain DCGAN loop=/tmp/r_gan_plain/result.json" "paratrain gan=/tmp/r_gan/result.json" "paratrain gan, uint8 to the GPU, prefetch=/tmp/r_gan_gpu/result.json" "the same, NaN guard off=/tmp/r_gan_gpu_noguard/result.json"
  # quality: a classifier paratrain trains, then the GAN's 10 epochs scored on it every epoch
  # (QUALITY=0 leaves it out: the throughput rows alone fit one call with room)
  if [ "${QUALITY:-1}" = 1 ]; then
  pt mnist_clf recipes/cases/mnist_classifier_cpu.yaml device=$DEV train.epochs=5 log.progress=false
  pt gan_quality "$G" device=$DEV strategy=single gan.classifier=/tmp/r_mnist_clf log.progress=false
  python3 - <<'PY' | tee -a "$OUT/rows.md"
import json
r = json.load(open("/tmp/r_gan_quality/result.json"))
print("\n### GAN quality per epoch (classifier: paratrain's MNIST tiny_cnn, 5 epochs)\n")
print("| epoch | D loss | G loss | D accuracy | fid_classifier | classifier_score |")
print("|---:|---:|---:|---:|---:|---:|")
for i, e in enumerate(r["epochs"]):
    print(f"| {i} | {e.get('val_d_loss', 0):.3f} | {e.get('val_g_loss', 0):.3f} | {e.get('val_d_accuracy', 0):.3f} | {e.get('fid_classifier', float('nan')):.1f} | {e.get('classifier_score', float('nan')):.2f} |")
c = json.load(open("/tmp/r_mnist_clf/result.json"))
print(f"\nclassifier held-out accuracy {c['summary'].get('val_accuracy')}")
PY
  last=$(ls /tmp/r_gan_quality/samples/*.png | sort -V | tail -1); cp "$last" "$OUT/gan_samples.png"
  cp /tmp/r_gan_quality/result.json "$OUT/gan_quality.json"
  fi
  cp /tmp/r_r50_fp32/result.json "$OUT/r50_fp32.json"; cp /tmp/r_gan/result.json "$OUT/gan.json"
fi

if [ "$MODE" = gpt2 ]; then
  LM="$COMMON strategy=single task=causal_lm data.source=synthetic-text model.init=random model.shape=gpt2 lora.enabled=false data.max_length=1024 data.batch_size=8 data.num_workers=0 precision=bf16"
  C="train.compile=true train.fused_optimizer=true"
  peer gpt2_plain_eager hf_lora "" $LM
  peer gpt2_plain_compiled hf_lora "" $LM $C
  pt gpt2_eager "" $LM
  pt gpt2_compiled "" $LM $C
  table "GPT-2 124M full training, bf16, 8 x 1,024 tokens, 1 H200" "plain transformers eager=/tmp/r_gpt2_plain_eager/result.json" "plain transformers compiled=/tmp/r_gpt2_plain_compiled/result.json" "paratrain eager=/tmp/r_gpt2_eager/result.json" "paratrain compiled=/tmp/r_gpt2_compiled/result.json"
  pt gpt2_docs recipes/cases/gpt2_python_docs.yaml device=$DEV log.progress=false train.max_steps=${DOCS_STEPS:-200}
  cp /tmp/r_gpt2_compiled/result.json "$OUT/gpt2_compiled.json"; cp /tmp/r_gpt2_docs/result.json "$OUT/gpt2_docs.json"
fi

if [ "$MODE" = bert ]; then
  LM="$COMMON strategy=single task=masked_lm data.source=synthetic-text model.init=random model.shape=bert-base data.max_length=512 data.batch_size=32 data.num_workers=2 precision=bf16"
  C="train.compile=true train.fused_optimizer=true"
  peer bert_plain_eager hf_bert "" $LM
  peer bert_plain_compiled hf_bert "" $LM $C
  pt bert_eager "" $LM
  pt bert_compiled "" $LM $C
  pt bert_compiled_noguard "" $LM $C train.max_bad_steps=-1
  table "BERT-base masked LM, bf16, 32 x 512 tokens, 1 H200" "plain transformers eager=/tmp/r_bert_plain_eager/result.json" "plain transformers compiled=/tmp/r_bert_plain_compiled/result.json" "paratrain eager=/tmp/r_bert_eager/result.json" "paratrain compiled=/tmp/r_bert_compiled/result.json" "paratrain compiled, NaN guard off=/tmp/r_bert_compiled_noguard/result.json"
  pt bert_docs recipes/cases/bert_mlm_python_docs.yaml device=$DEV log.progress=false train.max_steps=${DOCS_STEPS:-200}
  cp /tmp/r_bert_compiled/result.json "$OUT/bert_compiled.json"; cp /tmp/r_bert_docs/result.json "$OUT/bert_docs.json"
fi
if [ "$MODE" = guard ]; then
  R="recipes/cases/resnet50_seed_sgd.yaml"
  RS="$COMMON strategy=single data.source=synthetic data.synthetic_samples=4096 data.synthetic_size=224 data.channels=1 data.num_classes=1000 data.num_workers=8"
  LEVERS="precision=bf16 train.channels_last=true train.cudnn_benchmark=true train.compile=true data.prefetch_to_device=true data.persistent_workers=true data.resize_on=gpu"
  peer r50_plain_bf16 plain "$R" $RS precision=bf16
  pt r50_host "$R" $RS $LEVERS
  pt r50_fused "$R" $RS $LEVERS train.fused_optimizer=true
  pt r50_fused_noguard "$R" $RS $LEVERS train.fused_optimizer=true train.max_bad_steps=-1
  table "ResNet-50, the seed's SGD set-up, bf16, batch 32, 1 H200: where the NaN guard is judged" "plain seed-style bf16=/tmp/r_r50_plain_bf16/result.json" "paratrain, foreach SGD, host check=/tmp/r_r50_host/result.json" "paratrain, fused SGD, flag on the GPU=/tmp/r_r50_fused/result.json" "paratrain, fused SGD, no guard=/tmp/r_r50_fused_noguard/result.json"
  PARATRAIN_FAULTS=nan:step=30 pt r50_fused_nan "$R" $RS $LEVERS train.fused_optimizer=true
  python3 -c "import json; s = json.load(open('/tmp/r_r50_fused_nan/result.json'))['summary']; print('NaN at step 30 on the GPU flag: skipped_steps', s['skipped_steps'], 'train_loss', s['train_loss'])" | tee -a "$OUT/rows.md"
  LM="$COMMON strategy=single task=masked_lm data.source=synthetic-text model.init=random model.shape=bert-base data.max_length=512 data.batch_size=32 data.num_workers=2 precision=bf16 train.compile=true train.fused_optimizer=true"
  peer bert_plain hf_bert "" $LM
  pt bert_flag "" $LM
  pt bert_noguard "" $LM train.max_bad_steps=-1
  table "BERT-base masked LM, bf16, 32 x 512 tokens, compiled, fused AdamW, 1 H200" "plain transformers compiled=/tmp/r_bert_plain/result.json" "paratrain, flag on the GPU=/tmp/r_bert_flag/result.json" "paratrain, no guard=/tmp/r_bert_noguard/result.json"
  for n in r50_fused r50_fused_nan bert_flag; do cp /tmp/r_$n/result.json "$OUT/$n.json" 2>/dev/null; done
fi

if [ "$MODE" = guard2 ]; then  # the guard rows again, longer (STEPS=150) and interleaved twice
  LM="$COMMON strategy=single task=masked_lm data.source=synthetic-text model.init=random model.shape=bert-base data.max_length=512 data.batch_size=32 data.num_workers=2 precision=bf16 train.compile=true"
  for round in 1 2; do
    pt bert_host_$round "" $LM train.fused_optimizer=false
    pt bert_flag_$round "" $LM train.fused_optimizer=true
    pt bert_none_$round "" $LM train.fused_optimizer=true train.max_bad_steps=-1
  done
  table "BERT-base masked LM, bf16, 32 x 512, compiled, $STEPS steps, two interleaved rounds, 1 H200" "host check (foreach AdamW) 1=/tmp/r_bert_host_1/result.json" "flag on the GPU (fused AdamW) 1=/tmp/r_bert_flag_1/result.json" "no guard (fused AdamW) 1=/tmp/r_bert_none_1/result.json" "host check (foreach AdamW) 2=/tmp/r_bert_host_2/result.json" "flag on the GPU (fused AdamW) 2=/tmp/r_bert_flag_2/result.json" "no guard (fused AdamW) 2=/tmp/r_bert_none_2/result.json"
fi

if [ "$MODE" = parallel ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider tests/distributed/test_case_gpt2_parallel.py 2>&1 | tee "$OUT/gpt2_parallel_cpu_tests.txt" | tail -4
  LM="$COMMON task=causal_lm data.source=synthetic-text model.init=random model.shape=gpt2 lora.enabled=false data.max_length=1024 data.batch_size=8 data.num_workers=0 precision=bf16"
  pt gpt2_single "--nproc 1" $LM strategy=single
  pt gpt2_tp1 "--nproc 1" $LM strategy=tp
  table "GPT-2 124M full training, bf16, eager, 8 x 1,024 tokens, 1 H200" "paratrain single=/tmp/r_gpt2_single/result.json" "paratrain tp over a one-rank mesh=/tmp/r_gpt2_tp1/result.json"
  B=recipes/cases/bert_mlm_python_docs.yaml
  pt bert_w300 $B device=$DEV log.progress=false train.warmup_steps=300 train.max_steps=1500
  pt bert_w300_lr3 $B device=$DEV log.progress=false train.warmup_steps=300 train.max_steps=1500 train.lr=0.0003
  python3 - <<'PY' | tee -a "$OUT/rows.md"
import json
print("\n### bert_mlm_python_docs.yaml, 1,500 steps, 300 warm-up steps\n")
print("| lr | epoch | held-out loss | masked-token accuracy |")
print("|---:|---:|---:|---:|")
for name, lr in (("bert_w300", "1e-4"), ("bert_w300_lr3", "3e-4")):
    try:
        r = json.load(open(f"/tmp/r_{name}/result.json"))
    except OSError:
        continue
    for i, e in enumerate(r["epochs"]):
        print(f"| {lr} | {i} | {e.get('val_loss', float('nan')):.4f} | {e.get('val_masked_accuracy', e.get('val_accuracy', float('nan'))):.4f} |")
PY
  for n in gpt2_tp1 bert_w300 bert_w300_lr3; do cp /tmp/r_$n/result.json "$OUT/$n.json" 2>/dev/null; done
fi
MODE=$MODE python3 - <<'PY' | tee -a "$OUT/rows.md"
import glob, json, os
for p in sorted(glob.glob(f"/tmp/r_{os.environ['MODE']}_docs/result.json")):
    r = json.load(open(p)); e = r["epochs"][-1]; s = r["summary"]
    print(f"\n{p.split('/')[2]}: {s['optimizer_steps']} steps, {s.get('tokens_per_s', 0):,.0f} tokens/s, MFU {s.get('mfu') or 0:.1%}, last epoch {json.dumps({k: round(v, 4) for k, v in e.items() if isinstance(v, float)})}")
PY
