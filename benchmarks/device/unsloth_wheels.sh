#!/usr/bin/env bash
# Unsloth for the LoRA peers' rows (recipes/bench/lora_speed.yaml, program unsloth_lora), as
# wheels for the GPU machine (Python 3.12, nothing reachable), into the git-ignored .uwhl/. One
# call carries at most 64 MiB with the tree (~25 MB), so they travel in parts over calls on one
# warm machine (it keeps /tmp between calls and goes back after 30 s idle: chain them):
#   .uwhl/a   unsloth (29 MB, its web UI studio/ most of it)
#   .uwhl/b   what `import unsloth` and its 16-bit LoRA path import that the machine lacks:
#             unsloth_zoo, trl, datasets and theirs, xformers (it falls back to sdpa when its
#             build does not match the machine's torch, and says so)
#   .uwhl/c1, .uwhl/c2   bitsandbytes 0.50.2 (43 MB) cut in two (`split`, joined by `cat`):
#             on a GPU `import unsloth` stops without it ("Please install bitsandbytes"), though
#             16-bit LoRA runs none of its kernels
#   bash benchmarks/device/unsloth_wheels.sh
# The calls, as run on 2026-12-07 (benchmarks/results/2026-12-07-h100x1/lora_peers/README.md):
#   carry .uwhl/a .commit:   mkdir -p /tmp/uwhl && cp .uwhl/a/*.whl /tmp/uwhl/ [&& a short job]
#   carry .uwhl/c1 .commit:  cp .uwhl/c1/bnb.part.aa /tmp/
#   carry .whl .uwhl/b .uwhl/c2 .commit:
#     cat /tmp/bnb.part.aa .uwhl/c2/bnb.part.ab > /tmp/uwhl/bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl
#     export HF_HUB_OFFLINE=1 UNSLOTH_DISABLE_STATISTICS=1 PARATRAIN_RANDOM_WEIGHTS=/tmp/rw \
#       EXTRA_WHEELS="/tmp/uwhl .uwhl/b" MODE=lora ONLY_LORA='"=Unsloth, no gradient checkpointing" ...'
#     bash benchmarks/device/recipes_beside_anchors.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/device/pip_download.sh  # get DIR SPEC...
mkdir -p .uwhl/a .uwhl/b .uwhl/c1 .uwhl/c2 .uwhl/bnb
get .uwhl/a unsloth==2026.10.9
get .uwhl/b unsloth_zoo==2026.10.9 trl==1.15.0 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 \
  msgspec==0.23.0 cut_cross_entropy==25.1.1 json5==0.17.3 nest-asyncio==1.6.0 structlog==26.1.0 xformers==0.0.35
get .uwhl/bnb bitsandbytes==0.50.2
split -b 22000000 .uwhl/bnb/bitsandbytes-0.50.2-*.whl .uwhl/bnb.part.
mv .uwhl/bnb.part.aa .uwhl/c1/bnb.part.aa
mv .uwhl/bnb.part.ab .uwhl/c2/bnb.part.ab
du -sh .uwhl/a .uwhl/b .uwhl/c1 .uwhl/c2
