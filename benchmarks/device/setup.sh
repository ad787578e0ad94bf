# Sourced by a device script after it sets BUDGET's default: NVLink multicast off, $OUT, the
# carried wheels installed (.whl/ and .whl/tt/), paratrain's src on the path, the commit, and
# /tmp/machine.txt (the GPU, the versions that matter, the commit), printed once.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"; start=$SECONDS
# EXTRA_WHEELS="DIR ...": more folders of wheels (Unsloth's, benchmarks/device/unsloth_wheels.sh)
extra=(); for d in ${EXTRA_WHEELS:-}; do extra+=("$d"/*.whl); done
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl .whl/tt/*.whl "${extra[@]}" || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache
{ nvidia-smi -L; python3 - <<'PY'
import importlib.metadata as md
for p in ("torch", "torchtitan", "torchao", "transformers", "peft", "liger-kernel", "triton", "datasets",
          "unsloth", "unsloth_zoo", "xformers", "trl"):
    try: print(p, md.version(p))
    except md.PackageNotFoundError: print(p, "absent")
PY
echo "commit $PARATRAIN_COMMIT"; } > /tmp/machine.txt 2>&1; cat /tmp/machine.txt
