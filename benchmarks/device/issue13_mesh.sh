#!/usr/bin/env bash
# Issue 13 on one H200 (2026-12-01), after the seam was reshaped (ParallelDims / model specs /
# tasks / trainer / DCP checkpoints). MODE=tests: every GPU test (tests/gpu), among them the new
# model-parallel ones on a degenerate one-rank mesh (NCCL, DTensor, DCP). MODE=speed: rows
# measured before the redesign, again, each beside its plain reference in the same call, to see
# that nothing got slower: the 8B-shaped LoRA (transformers + peft, paratrain fp8 tensorwise) and
# the image step (plain seed-style script, paratrain fastest), 1 GPU.
#   device run (kind nvidia-h200, carry .whl .commit):  MODE=tests bash benchmarks/device/issue13_mesh.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
{ nvidia-smi -L; python3 -c "import torch, transformers, peft; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'transformers', transformers.__version__, 'peft', peft.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
if [ "${MODE:-tests}" = tests ]; then
  timeout 560 python3 -m pytest -q -m gpu tests/gpu -p no:cacheprovider -rs --durations=15 2>&1 | tee "$OUT/gpu_tests.txt" | tail -40
  exit 0
fi
DB=/tmp/results.db
timeout 330 python3 -m paratrain bench recipes/bench/lora_speed.yaml --grid launch.nproc=1 \
  --only transformers --only tensorwise --db $DB --runs-dir /tmp/runs --no-progress 2>&1 | tee "$OUT/bench.log" | tail -5
timeout 230 python3 -m paratrain bench recipes/bench/speed.yaml --grid launch.nproc=1 \
  --only "plain" --only "paratrain fastest" --db $DB --runs-dir /tmp/runs --no-progress 2>&1 | tee -a "$OUT/bench.log" | tail -5
python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" $DB "$OUT/results.db"
for f in /tmp/runs/*/*/log.txt; do echo "== $f"; grep -iE "error|Traceback|tokens/s|img/s|samples/s" "$f" | tail -4; done > "$OUT/logs.txt" 2>/dev/null
python3 -m paratrain report --db "$OUT/results.db" --out "$OUT/report.md" >/dev/null 2>&1
cat "$OUT/report.md" | head -60
