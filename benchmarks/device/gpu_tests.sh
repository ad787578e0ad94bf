#!/usr/bin/env bash
# GPU tests and the plan's machine reading on the lent GPU. PATHS: the test files (default: the
# two not yet run on a GPU); K: a pytest -k expression; TIMEOUT: seconds, then SIGINT (pytest
# still prints what ran, a line a test). Back: gpu_tests.txt (pytest -rA),
# machine.txt (the GPU, versions, commit; the levers' NVML reading against torch's).
#   device run (carry .whl .commit):  bash benchmarks/device/gpu_tests.sh
set -uo pipefail
source "$(dirname "$0")/setup.sh"  # wheels, paths, machine.txt
python3 - >>/tmp/machine.txt 2>&1 <<'PY'
import torch
from paratrain.runplan import levers
m = levers.machine_of("cuda")  # NVML: must make no CUDA context
print("machine_of:", m, "| CUDA context made:", torch.cuda.is_initialized())
print("torch reads:", torch.cuda.get_device_capability(0), torch.cuda.get_device_name(0))
PY
cp /tmp/machine.txt "$OUT/"; tail -2 /tmp/machine.txt
timeout -s INT -k 20 ${TIMEOUT:-520} python3 -m pytest -v -rA --show-capture=no -m gpu \
  ${PATHS:-tests/gpu/test_gpu_model_parallel.py tests/gpu/test_gpu_triton_loss.py} ${K:+-k "$K"} \
  -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt" | tail -15
