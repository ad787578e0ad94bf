#!/usr/bin/env bash
# Issue 13 on one H200 (2026-12-01), after the seam was reshaped (ParallelDims / model specs /
# tasks / trainer / DCP checkpoints). MODE=tests: every GPU test (tests/gpu), among them the new
# model-parallel ones on a degenerate one-rank mesh (NCCL, DTensor, DCP). MODE=speed: rows
# measured before the redesign, again, each beside its plain reference in the same call, to see
# that nothing got slower: the 8B-shaped LoRA (transformers + peft, paratrain fp8 tensorwise) and
# the image step (plain seed-style script, paratrain fastest), 1 GPU.
#   device run (kind nvidia-h200, carry .whl .commit):  MODE=tests bash benchmarks/device/mesh_gpu_tests.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
{ nvidia-smi -L; python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'transformers', transformers.__version__, 'peft', peft.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
start=$SECONDS
if [ "${MODE:-tests}" = tests ]; then
  timeout 560 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -rs --durations=15 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
  exit 0
fi
if [ "$MODE" = mp ]; then  # the model-parallel GPU tests, and two plain AdamW runs side by side
  timeout 240 python3 -m pytest -q -m gpu tests/gpu/test_gpu_model_parallel.py -p no:cacheprovider -rs --durations=8 2>&1 | tee "$OUT/gpu_tests_mp.txt" | tail -12
  C="--set data.source=synthetic-text --set model.init=random --set model.shape=tiny --set device=cuda --set data.num_workers=0 --set data.max_length=64 --set data.batch_size=4 --set train.max_steps=4 --set train.warmup_steps=1 --set log.progress=false --set lora.enabled=false --set train.lr=0.01"
  for r in a b; do python3 -m paratrain run $C --output-dir /tmp/adamw_$r >/dev/null 2>&1; done
  (cd tests && python3 -c "
from conftest import final_weights, max_abs_diff
print('two plain AdamW runs, max weight difference after 4 steps:', max_abs_diff(final_weights('/tmp/adamw_a'), final_weights('/tmp/adamw_b')))") 2>&1 | tee "$OUT/adamw_nondeterminism.txt"
  MODE=speed
fi
DB=/tmp/results.db
left=$((560 - (SECONDS - start))); [ $left -gt 120 ] || exit 0
timeout $((left * 6 / 10)) python3 -m paratrain bench recipes/bench/lora_speed.yaml --grid launch.nproc=1 \
  --only transformers --only tensorwise --db $DB --runs-dir /tmp/runs --no-progress 2>&1 | tee "$OUT/bench.log" | tail -5
left=$((570 - (SECONDS - start))); [ $left -gt 90 ] || left=0
[ $left -gt 0 ] && timeout $left python3 -m paratrain bench recipes/bench/speed.yaml --grid launch.nproc=1 \
  --only "plain" --only "paratrain fastest" --db $DB --runs-dir /tmp/runs --no-progress 2>&1 | tee -a "$OUT/bench.log" | tail -5
python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" $DB "$OUT/results.db"
for f in /tmp/runs/*/*/log.txt; do echo "== $f"; grep -iE "error|Traceback|tokens/s|img/s|samples/s" "$f" | tail -4; done > "$OUT/logs.txt" 2>/dev/null
python3 -m paratrain report --db "$OUT/results.db" --out "$OUT/report.md" >/dev/null 2>&1
cat "$OUT/report.md" | head -60
