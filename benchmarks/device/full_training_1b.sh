#!/usr/bin/env bash
# Issue 15 on one H200: full training of the Llama-3.2-1B shape (random init, bf16 autocast over
# fp32 weights, batch 4 x 2,048 tokens, AdamW), paratrain's variants beside the plain
# transformers loop (eager; and compiled per decoder layer with fused AdamW, what a user adds by
# hand), all in one lease. PROFILE=<variant>: that row profiled first (profile.txt back);
# VARIANTS picks paratrain rows by name, PLAIN the plain loop's (eager, compiled; "" none).
# The 8B shape in full on one GPU: SHAPE=llama3-8b BATCH=2 STEPS=16 PLAIN="" VARIANTS="8b_...".
# CURVE=N: first the plain compiled loop and paratrain compiled for N steps on the same batches
# (same init, same rows in the same order), each step's loss back in curve.json / curve.png.
#   device run (kind nvidia-h200, carry .whl .commit):  bash benchmarks/device/full_training_1b.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
DEV=${DEV:-cuda}; SHAPE=${SHAPE:-llama3.2-1b}; STEPS=${STEPS:-30}; LEN=${LEN:-2048}; BATCH=${BATCH:-4}
PLAIN=${PLAIN-eager compiled}
VARIANTS=${VARIANTS-"compiled compiled_chunked compiled_chunked_noguard"}
{ nvidia-smi -L 2>/dev/null; python3 -c "import torch; print('torch', torch.__version__)"; echo "commit $PARATRAIN_COMMIT"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
BASE="data.source=synthetic-text model.init=random model.shape=$SHAPE device=$DEV data.num_workers=0 data.max_length=$LEN data.batch_size=$BATCH train.max_steps=$STEPS train.warmup_steps=10 log.progress=false lora.enabled=false precision=bf16 checkpoint.at_end=false train.eval=false ${EXTRA:-}"
sets() { for s in $BASE "$@"; do printf -- '--set %s ' "$s"; done; }
declare -A V=(
  [eager]=""
  [compiled]="train.compile=true train.fused_optimizer=true"
  [compiled_chunked]="train.compile=true train.fused_optimizer=true model.loss_chunk_tokens=1024"
  [compiled_chunked_noguard]="train.compile=true train.fused_optimizer=true model.loss_chunk_tokens=1024 train.max_bad_steps=-1"
  [compiled_liger_loss]="train.compile=true train.fused_optimizer=true model.kernels=liger-loss"
  [compiled_cudnn]="train.compile=true train.fused_optimizer=true train.sdpa_backend=cudnn"
  [compiled_fp8]="train.compile=true train.fused_optimizer=true model.fp8=rowwise"
  [compiled_fp8_tensorwise]="train.compile=true train.fused_optimizer=true model.fp8=tensorwise"
  [8b_adamw_ac]="train.activation_checkpointing=true model.loss_chunk_tokens=1024 train.fused_optimizer=true"
  [8b_adamw8bit_ac]="train.compile=true train.optimizer=adamw8bit train.activation_checkpointing=true model.loss_chunk_tokens=1024"
  [8b_adamw8bit]="train.compile=true train.optimizer=adamw8bit model.loss_chunk_tokens=1024"
  [8b_adamw8bit_fp8]="train.compile=true train.optimizer=adamw8bit model.loss_chunk_tokens=1024 model.fp8=tensorwise"
  [8b_compiled_ac]="train.compile=true train.fused_optimizer=true train.activation_checkpointing=true"
  [8b_adamw8bit_fp8_whole]="train.compile=true train.optimizer=adamw8bit model.fp8=tensorwise"
  [fsdp_offload]="strategy=fsdp parallel.cpu_offload=true train.compile=true train.fused_optimizer=true"
  [8b_fsdp_offload_8bit_ac]="strategy=fsdp parallel.cpu_offload=true train.optimizer=adamw8bit train.activation_checkpointing=true train.compile=true"
  [8b_fsdp_offload_ac]="strategy=fsdp parallel.cpu_offload=true train.fused_optimizer=true train.activation_checkpointing=true train.compile=true"
  [compiled_ac]="train.compile=true train.fused_optimizer=true model.loss_chunk_tokens=1024 train.activation_checkpointing=true"
)
row() {  # name result.json
  python3 - "$1" "$2" <<'PY' | tee -a "$OUT/rows.txt"
import json, sys
r = json.load(open(sys.argv[2])); s = r["summary"]
mfu = s.get("mfu"); mfu = f"{mfu:.1%}" if mfu else "-"
print(f"{sys.argv[1]:<34} {s['tokens_per_s']:>10,.0f} tokens/s  {s['step_time_s']*1000:7.1f} ms/step  MFU {mfu:>6}  peak {s['peak_memory_bytes']/2**30:6.1f} GiB  loss {s['train_loss']:.4f}")
PY
}
plain() {  # eager | compiled
  local extra=""; [ "$1" = compiled ] && extra="train.compile=true train.fused_optimizer=true"
  python3 -m paratrain run $(sets $extra) --print-config > /tmp/plain_$1.yaml
  timeout 240 python3 -m paratrain.bench.peers.hf_lora /tmp/plain_$1.yaml /tmp/plain_$1 > /tmp/plain_$1.log 2>&1 || tail -5 /tmp/plain_$1.log
  # the peer writes no MFU: the same FLOPs per token as paratrain's row
  python3 - /tmp/plain_$1/result.json <<'PY'
import json, sys
p = sys.argv[1]; r = json.load(open(p)); s = r["summary"]
s.setdefault("mfu", None); json.dump(r, open(p, "w"))
PY
  row "plain transformers ($1)" /tmp/plain_$1/result.json
}
pt() {  # name [more settings]
  local n=$1; shift
  rm -rf /tmp/pt_$n
  timeout 300 python3 -m paratrain run $(sets ${V[$n]} "$@") --output-dir /tmp/pt_$n > /tmp/pt_$n.log 2>&1 || tail -5 /tmp/pt_$n.log
  grep "^paratrain: " /tmp/pt_$n.log | head -3 >> "$OUT/lines.txt"
  row "paratrain $n" /tmp/pt_$n/result.json
  cp /tmp/pt_$n/result.json "$OUT/pt_$n.json" 2>/dev/null
}
if [ -n "${CURVE:-}" ]; then  # the loss curves, plain loop and paratrain, on the same batches
  C="train.max_steps=$CURVE train.compile=true train.fused_optimizer=true"
  python3 -m paratrain run $(sets $C) --print-config > /tmp/curve_plain.yaml
  timeout 300 python3 -m paratrain.bench.peers.hf_lora /tmp/curve_plain.yaml /tmp/curve_plain > /tmp/curve_plain.log 2>&1 || tail -5 /tmp/curve_plain.log
  rm -rf /tmp/curve_pt
  timeout 300 python3 -m paratrain run $(sets $C log.every_steps=1) --output-dir /tmp/curve_pt > /tmp/curve_pt.log 2>&1 || tail -5 /tmp/curve_pt.log
  cp /tmp/curve_pt/steps.jsonl "$OUT/curve_paratrain_steps.jsonl"; cp /tmp/curve_plain/result.json "$OUT/curve_plain.json"
  python3 benchmarks/device/loss_curves.py /tmp/curve_pt/steps.jsonl /tmp/curve_plain/result.json "$OUT" | tee -a "$OUT/rows.txt"
fi
if [ -n "${PROFILE:-}" ]; then  # one profiled row first: PROFILE=<variant>
  rm -rf /tmp/pt_prof; timeout 300 python3 -m paratrain run $(sets ${V[$PROFILE]} train.profile_steps=3) --output-dir /tmp/pt_prof > /tmp/pt_prof.log 2>&1 || tail -5 /tmp/pt_prof.log
  mkdir -p "$OUT/profile_$PROFILE"; cp /tmp/pt_prof/profile*.txt /tmp/pt_prof/result.json "$OUT/profile_$PROFILE/" 2>/dev/null; ls /tmp/pt_prof
fi
for p in $PLAIN; do plain $p; done
for v in $VARIANTS; do pt $v; done
for p in $PLAIN; do [ -f /tmp/plain_$p/result.json ] && cp /tmp/plain_$p/result.json "$OUT/plain_$p.json"; done
