#!/usr/bin/env bash
# Unsloth for the LoRA peers' rows (recipes/bench/lora_speed.yaml, program unsloth_lora), as
# wheels for the GPU machine (Python 3.12, nothing reachable), into the git-ignored .uwhl/ in two
# halves: one call carries at most 64 MiB with the tree (~25 MB), and unsloth's wheel alone is
# 29 MB (its web UI, studio/, is most of it). .uwhl/a: unsloth; .uwhl/b: what `import unsloth` and
# its 16-bit LoRA path import that the machine lacks (unsloth_zoo, trl, datasets and theirs,
# xformers). Not bitsandbytes (43 MB): Unsloth uses it only for 4-/8-bit loading and 8-bit
# AdamW, and imports without it ("16bit LoRA and full finetuning work without it").
#   bash benchmarks/device/unsloth_wheels.sh
# Then one call stashes the first half on the warm machine and the next installs both:
#   device run (carry .uwhl/a):       mkdir -p /tmp/uwhl && cp .uwhl/a/*.whl /tmp/uwhl/; ...
#   device run (carry .whl .uwhl/b .commit):  EXTRA_WHEELS="/tmp/uwhl .uwhl/b" ... bash benchmarks/device/recipes_beside_anchors.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
get() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any -d "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
mkdir -p .uwhl/a .uwhl/b
get .uwhl/a unsloth==2026.10.9
get .uwhl/b unsloth_zoo==2026.10.9 trl==1.15.0 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 \
  msgspec==0.23.0 cut_cross_entropy==25.1.1 json5 nest-asyncio structlog xformers==0.0.35
du -sh .uwhl/a .uwhl/b
