#!/usr/bin/env bash
# Issue 62 item 2 on one GPU: the 8B LoRA recipe as shipped (lora.fused: each adapter's product
# inside its base matmul) beside the same with peft's own adapter layers (lora.fused=false), at
# batch 2 and 8, with compiled peft and Unsloth as anchors in the same call. Unsloth's wheels
# travel in parts before it (benchmarks/device/unsloth_wheels.sh: /tmp/uwhl holds .uwhl/a's wheel
# and /tmp/bnb.part.aa bitsandbytes' first half); without them its row fails and the rest stand.
#   device run (carry .whl .uwhl/b .uwhl/c2 .commit):  bash benchmarks/device/lora_fused.sh
#   without Unsloth (carry .whl .commit):               UNSLOTH=0 bash benchmarks/device/lora_fused.sh
set -uo pipefail
if [ -e /tmp/bnb.part.aa ] && [ -e .uwhl/c2/bnb.part.ab ]; then
  cat /tmp/bnb.part.aa .uwhl/c2/bnb.part.ab > /tmp/uwhl/bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl
fi
export HF_HUB_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1 PARATRAIN_RANDOM_WEIGHTS=/tmp/rw
export EXTRA_WHEELS="${EXTRA_WHEELS-/tmp/uwhl .uwhl/b}" MODE=lora BUDGET=${BUDGET:-575}
export BENCH_FLAGS="${BENCH_FLAGS:---set train.max_steps=40}" REF_LORA="paratrain as shipped"
fused="paratrain as shipped" peft="paratrain as shipped, peft's adapter layers"
big="paratrain as shipped, largest batch (8)"
bigpeft="paratrain as shipped, largest batch (8), peft's adapter layers"
rows="\"=$fused\" \"=$peft\" \"=transformers + peft, compiled\" \"=$big\" \"=$bigpeft\""
# UNSLOTH=0: no Unsloth row (no wheels carried: one call on a fresh machine)
[ "${UNSLOTH:-1}" = 0 ] && export EXTRA_WHEELS="" || rows="$rows \"=Unsloth, no gradient checkpointing\""
export ONLY_LORA="${ONLY_LORA:-$rows}"
export PAIRS_LORA="\"$fused=$peft\" \"$big=$bigpeft\" \"$fused=transformers + peft, compiled\" \"$fused=Unsloth, no gradient checkpointing\""
bash "$(dirname "$0")/recipes_beside_anchors.sh"
