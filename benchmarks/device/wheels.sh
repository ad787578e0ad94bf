#!/usr/bin/env bash
# The wheels the GPU machine lacks (Python 3.12 there, nothing reachable), into the git-ignored
# .whl/ that device calls carry: paratrain's own dependencies missing there (pydantic and its
# parts, mlxtend), torchao and liger-kernel, and in .whl/tt/ torchtitan 0.2.2 with what it
# imports (torchdata, tyro < 1, tomli ...). A new checkout has no .whl/: run this first.
#   bash benchmarks/device/wheels.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/device/pip_download.sh  # get DIR SPEC...
mkdir -p .whl/tt
get .whl "pydantic>=2.7" pydantic-core annotated-types typing-inspection typing_extensions \
  mlxtend torchao==0.18.0 liger-kernel==0.8.5
get .whl/tt torchtitan==0.2.2 torchdata "tyro<1" tomli docstring-parser typeguard shtab
ls .whl .whl/tt
