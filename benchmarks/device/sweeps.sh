#!/usr/bin/env bash
# Sweeps on a lent GPU machine: runs the sweeps named in SWEEPS (default lora_speed) into one
# results DB, within BUDGET seconds, so the call ends inside the device tool's 10-minute limit.
# An entry may carry grid axes after colons: seed_dp_modes:launch.nproc=1,2,4 runs that sweep
# with `--grid launch.nproc=1,2,4` (a machine with more GPUs than the sweep file names). The DB lives in /tmp (kept while the machine is
# warm) and is seeded from .devdb/results.db when the machine is fresh: a second call picks up
# where the first stopped (completed runs are skipped). GPU_TESTS="<pytest -k expression>" first
# runs the matching tests of tests/gpu (GPU_TESTS=all: every one); PROFILE="<recipe> --set k=v ..."
# then profiles one run (profile.txt and profile_result.json come back); COMM="<paratrain comm
# flags>" runs the collectives benchmark (comm.json comes back). BENCH_FLAGS="--repeats 3 --only fp8"
# goes to every sweep's `paratrain bench`. Profiled bench runs come back under profiles/;
# SAVE_AUTOTUNE=1 brings inductor's autotuning results back as autotune.tgz (carry it in .devdb/).
#   device run (kind nvidia-h200-x2, carry .whl .commit .devdb):
#     SWEEPS="lora_speed speed" GPU_TESTS="cudnn or liger" bash benchmarks/device/sweeps.sh
#     SWEEPS="seed_dp_modes:launch.nproc=1,2,4 seed_precision:launch.nproc=4" bash benchmarks/device/sweeps.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$SECONDS; BUDGET=${BUDGET:-540}
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD/src:/tmp/site PARATRAIN_COMMIT=$(cat .commit 2>/dev/null || echo unknown)
DB=/tmp/results.db
[ -f $DB ] || cp .devdb/results.db $DB 2>/dev/null || true
# Inductor's autotuning results (*.best_config beside each kernel, e.g. what coordinate descent
# tuning found: minutes of benchmarking per model) carried from an earlier machine: the same
# kernel source finds its config again. SAVE_AUTOTUNE=1 brings this machine's back.
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor_cache; mkdir -p $TORCHINDUCTOR_CACHE_DIR
[ -f .devdb/autotune.tgz ] && tar xzf .devdb/autotune.tgz -C $TORCHINDUCTOR_CACHE_DIR
if [ -n "${GPU_TESTS:-}" ]; then
  select=(); [ "$GPU_TESTS" = all ] || select=(-k "$GPU_TESTS")
  timeout 300 python3 -m pytest -q -m gpu tests/gpu "${select[@]}" -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.txt" | tail -25
fi
if [ -n "${PROFILE:-}" ]; then  # PROFILE="<recipe> --set ...": one run with 3 profiled steps
  timeout 300 python3 -m paratrain run $PROFILE --set train.profile_steps=3 --output-dir /tmp/profile 2>&1 | tail -3
  cp /tmp/profile/profile.txt "$OUT/profile.txt"; cp /tmp/profile/result.json "$OUT/profile_result.json"
fi
if [ -n "${COMM:-}" ]; then  # COMM="--max-bytes 1G": the collectives benchmark on every GPU
  timeout 200 python3 -m paratrain comm $COMM --out /tmp/comm 2>&1 | tail -25
  cp /tmp/comm/result.json "$OUT/comm.json"; cp /tmp/comm/busbw.png "$OUT/comm_busbw.png"
fi
eval "flags=(${BENCH_FLAGS:-})"  # shell words: --only 'a label with spaces' stays one argument
for entry in ${SWEEPS:-lora_speed}; do
  [ "$entry" = none ] && continue  # SWEEPS=none: only the tests, profile or comm above
  IFS=: read -r sweep axes <<<"$entry"; grid=()
  for axis in ${axes//:/ }; do grid+=(--grid "$axis"); done
  left=$((BUDGET - (SECONDS - start))); [ $left -gt 60 ] || { echo "budget spent before $sweep"; break; }
  timeout -k 15 $left python3 -m paratrain bench recipes/bench/$sweep.yaml "${grid[@]}" "${flags[@]}" --db $DB --runs-dir /tmp/runs --no-progress
done 2>&1 | tee -a "$OUT/bench.log"
# A consistent copy of the WAL-mode DB, then the lines worth reading from every run's log.
python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()" $DB "$OUT/results.db"
for f in /tmp/runs/*/*/log.txt; do echo "== $f"; grep -iE "error|Traceback|tokens/s|img/s|warn|cudagraph" "$f" | tail -6; done > "$OUT/logs.txt" 2>/dev/null
for f in /tmp/runs/*/*/profile.txt; do  # profiled bench runs: $OUT/profiles/<run key>/
  [ -f "$f" ] || continue; d="$OUT/profiles/$(basename "$(dirname "$f")")"; mkdir -p "$d"
  cp "$f" "$(dirname "$f")/trace.json.gz" "$d/" 2>/dev/null
done
if [ "${SAVE_AUTOTUNE:-0}" = 1 ]; then
  (cd $TORCHINDUCTOR_CACHE_DIR && find . -name '*.best_config' | tar czf "$OUT/autotune.tgz" -T -)
fi
python3 -m paratrain report --db "$OUT/results.db" --out "$OUT/report.md" >/dev/null 2>&1
grep -B2 -A16 -i "llm\|tokens/s" "$OUT/report.md" | head -40
