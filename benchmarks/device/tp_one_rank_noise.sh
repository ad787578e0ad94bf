#!/usr/bin/env bash
# Issue 13's last GPU question (2026-12-01): one-rank TP on the H200 ended 2e-2 away from a plain
# run after 4 AdamW steps. Is that TP, or the GPU's own run-to-run noise amplified by AdamW?
# Runs: the model-parallel GPU tests (SGD comparisons), then per parameter the largest weight
# difference after 4 steps for plain vs plain and plain vs TP, with AdamW and with SGD.
#   device run (kind nvidia-h200, carry .whl .commit):  bash benchmarks/device/tp_one_rank_noise.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
DEV=${DEV:-cuda}
{ nvidia-smi -L; python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"; git rev-parse HEAD 2>/dev/null || cat .commit; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if [ "$DEV" = cuda ]; then
  timeout 300 python3 -m pytest -q -m gpu tests/gpu/test_gpu_model_parallel.py -p no:cacheprovider -rs --durations=8 2>&1 | tee "$OUT/gpu_tests_mp.txt" | tail -12
fi
C="--set data.source=synthetic-text --set model.init=random --set model.shape=tiny --set device=$DEV --set data.num_workers=0 --set data.max_length=64 --set data.batch_size=4 --set train.max_steps=4 --set train.warmup_steps=1 --set log.progress=false --set lora.enabled=false --set train.lr=0.01"
for opt in adamw sgd; do
  for r in plain_a plain_b tp; do
    extra=""; [ $r = tp ] && extra="--set strategy=tp"
    timeout 120 python3 -m paratrain run $C --set train.optimizer=$opt $extra --output-dir /tmp/d_${opt}_$r > /tmp/d_${opt}_$r.log 2>&1 || { echo "$opt $r FAILED"; tail -3 /tmp/d_${opt}_$r.log; }
  done
done
(cd tests && python3 -c "
from conftest import final_weights
for opt in ('adamw', 'sgd'):
    a, b, t = (final_weights(f'/tmp/d_{opt}_{r}') for r in ('plain_a', 'plain_b', 'tp'))
    for label, other in (('plain vs plain', b), ('plain vs tp', t)):
        diffs = {k: (a[k].float() - other[k].float()).abs().max().item() for k in a}
        worst = sorted(diffs.items(), key=lambda kv: -kv[1])[:4]
        print(f'{opt:5s} {label:15s} max {max(diffs.values()):.3e}  worst: ' + ', '.join(f'{k} {v:.1e}' for k, v in worst))
") 2>&1 | tee "$OUT/weight_diffs.txt"
