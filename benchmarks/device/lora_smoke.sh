#!/usr/bin/env bash
# Issue 4, first look on one H200: does LoRA fine-tuning run under the machine's torch 2.11,
# transformers and peft (bf16, ddp-ds and fsdp), and what does a llama3.2-1b-shaped model give.
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD/src PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'transformers', transformers.__version__, 'peft', peft.__version__)"
common="--set log.progress=false --set checkpoint.at_end=false --set train.warmup_steps=3"
for strategy in ddp-ds fsdp; do
  python3 -m paratrain run recipes/tiny_lora_cpu.yaml --nproc 1 --set device=cuda --set precision=bf16 \
    --set strategy=$strategy --set train.max_steps=8 $common --output-dir "$OUT/tiny_$strategy" 2>&1 | grep -E "^paratrain: (ddp|fsdp|error)|Error" | head -5
done
timeout 150 python3 -m paratrain run recipes/llama3_8b_lora_random.yaml --nproc 1 --set model.shape=llama3.2-1b \
  --set train.max_steps=15 $common --output-dir "$OUT/llama1b" 2>&1 | grep -E "^paratrain: (ddp|error)|Error" | head -5
rm -rf "$OUT"/*/checkpoints "$OUT"/*/adapter
