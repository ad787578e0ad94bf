#!/usr/bin/env bash
# Two halves of one 1-GPU sweep side by side, one per GPU, within BUDGET seconds: twice the
# variants per device call when exploring. HALVES="text,text|text,text" holds the `--only` texts of
# the half on GPU 0, then of the half on GPU 1. Each half has its own DB; they are merged into
# results.db. Profiles (profile.txt, trace.json.gz) of the runs that asked for one come back too.
# Inductor compiles with at most 12 threads per process, so one half compiling leaves the CPUs
# the other needs to launch its kernels.
#   device run (kind nvidia-h200-x2, carry .whl .commit):
#     HALVES="compile default,eager|paratrain fastest" SWEEP=speed_levers bash benchmarks/device/split.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 TORCHINDUCTOR_COMPILE_THREADS=12
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
BUDGET=${BUDGET:-540}; SWEEP=${SWEEP:-speed_levers}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
IFS='|' read -r -a halves <<<"$HALVES"
for gpu in "${!halves[@]}"; do
  only=(); IFS=',' read -r -a texts <<<"${halves[$gpu]}"
  for t in "${texts[@]}"; do only+=(--only "$t"); done
  CUDA_VISIBLE_DEVICES=$gpu timeout -k 15 "$BUDGET" python3 -m paratrain bench \
    "recipes/bench/$SWEEP.yaml" "${only[@]}" ${BENCH_FLAGS:-} --db "/tmp/gpu$gpu.db" \
    --runs-dir "/tmp/runs$gpu" --no-progress >"$OUT/bench_gpu$gpu.log" 2>&1 &
done
wait
python3 - "$OUT/results.db" /tmp/gpu*.db <<'PY'
import sqlite3, sys
out = sqlite3.connect(sys.argv[1])
for i, path in enumerate(sys.argv[2:]):
    src = sqlite3.connect(path)
    if i == 0:
        src.backup(out)  # the schema and the first half's rows
    else:
        out.execute("ATTACH ? AS half", (path,))
        for table in ("runs", "sweeps"):
            out.execute(f"INSERT OR IGNORE INTO {table} SELECT * FROM half.{table}")
        out.commit()
        out.execute("DETACH half")
print(out.execute("SELECT count(*) FROM runs").fetchone()[0], "runs merged")
PY
for f in /tmp/runs*/*/*/profile.txt; do
  [ -f "$f" ] || continue
  d="$OUT/profiles/$(basename "$(dirname "$f")")"; mkdir -p "$d"
  cp "$f" "$(dirname "$f")/trace.json.gz" "$d/" 2>/dev/null
  cp "$(dirname "$f")/config.yaml" "$d/"
done
for f in /tmp/runs*/*/*/log.txt; do echo "== $f"; grep -iE "error|Traceback|img/s|samples/s|warn|cudagraph" "$f" | tail -6; done >"$OUT/logs.txt" 2>/dev/null
python3 -m paratrain report --db "$OUT/results.db" --out "$OUT/report.md" >/dev/null 2>&1
grep -A16 -i "speed_levers" "$OUT/report.md" | head -30
