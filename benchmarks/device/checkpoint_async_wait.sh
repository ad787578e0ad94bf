#!/usr/bin/env bash
# Issue 14's GPU-only parts on one H200: (1) how long training waits for a checkpoint with
# checkpoint.async_mode none / async (a Llama-3.2-1B-shaped model cut to 4 layers,
# full training, bf16: ~6.7 GB of weights and AdamW state per save, saves 300 steps apart, 2 per
# run); the newest checkpoints compared (the GPU runs are not deterministic: close, not equal). (2) NCCL's flight recorder: one NCCL rank's
# recorder dumped through paratrain.distributed.flight and read back by `paratrain flight`.
#   device run (kind nvidia-h200, carry .whl .commit):  bash benchmarks/device/checkpoint_async_wait.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
DEV=${DEV:-cuda}; SHAPE=${SHAPE:-llama3.2-1b}; LAYERS=${LAYERS:-4}; STEPS=${STEPS:-610}; EVERY=${EVERY:-300}
{ nvidia-smi -L 2>/dev/null; python3 -c "import torch; print('torch', torch.__version__)"; echo "commit $PARATRAIN_COMMIT"; df -h /tmp | tail -1; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
C="--set data.source=synthetic-text --set model.init=random --set model.shape=$SHAPE --set model.layers=$LAYERS --set device=$DEV --set data.num_workers=0 --set data.max_length=2048 --set data.batch_size=4 --set train.max_steps=$STEPS --set train.warmup_steps=5 --set log.progress=false --set lora.enabled=false --set precision=bf16 --set train.eval=false --set checkpoint.every_steps=$EVERY --set checkpoint.keep=1 --set checkpoint.at_end=false"
MODES=${MODES:-none async}
[ "$DEV" = cpu ] && MODES="none async"
for mode in $MODES; do
  rm -rf /tmp/ck_$mode
  timeout 200 python3 -m paratrain run $C --set checkpoint.async_mode=$mode --output-dir /tmp/ck_$mode > /tmp/ck_$mode.log 2>&1 || tail -5 /tmp/ck_$mode.log
  python3 - /tmp/ck_$mode/result.json $mode <<'PY' | tee -a "$OUT/async_save.txt"
import json, sys
s = json.load(open(sys.argv[1]))["summary"]; c = s["checkpoint"]
print(f"async_mode={sys.argv[2]:<7} {c['saves']} saves, the steps waited {c['blocking_s']:.2f} s ({c['blocking_s']/max(c['saves'],1):.2f} s per save), the end {c['end_wait_s']:.2f} s; {s['tokens_per_s']:,.0f} tokens/s, wall {s['wall_s']:.1f} s")
PY
  du -sh /tmp/ck_$mode/checkpoints/* 2>/dev/null | tail -1 | tee -a "$OUT/async_save.txt"
done
python3 - $MODES <<'PY' | tee -a "$OUT/async_save.txt"
import sys
from paratrain.checkpoint import list_checkpoints, read_checkpoint
modes = sys.argv[1:]
ref = read_checkpoint(list_checkpoints("/tmp/ck_none/checkpoints")[-1])
for m in modes[1:]:
    got = read_checkpoint(list_checkpoints(f"/tmp/ck_{m}/checkpoints")[-1])
    diff = max((got["model"][k].float() - ref["model"][k].float()).abs().max().item() for k in ref["model"])
    print(f"{m}: newest checkpoint step {got['loop']['step']}, max |weight - waited run's| = {diff:g}")
PY
rm -rf /tmp/ck_*/checkpoints
# (2) the flight recorder under NCCL, one rank
cat > /tmp/fr_nccl.py <<'PY'
import os, sys
from pathlib import Path
import torch, torch.distributed as dist
from paratrain.distributed import flight
folder = Path(sys.argv[1])
flight.enable(2000, folder, cuda=True)
dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda")
for _ in range(4):
    dist.all_reduce(x)
dist.broadcast(x, 0)
torch.cuda.synchronize()
print("dumped:", flight.dump(folder, dist.get_rank(), "nccl"))
dist.destroy_process_group()
PY
timeout 120 torchrun --standalone --nproc-per-node 1 /tmp/fr_nccl.py /tmp/fr 2>&1 | grep -v "^W\|^\*" | tail -3 | tee "$OUT/flight_nccl.txt"
timeout 60 python3 -m paratrain flight /tmp/fr 2>&1 | tee -a "$OUT/flight_nccl.txt"
