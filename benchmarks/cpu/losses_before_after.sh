#!/usr/bin/env bash
# The CPU recipes' losses, step by step, from two checkouts: BEFORE's src/ (a worktree of an
# earlier commit) and this one's. A change that should not touch numerics (a regrouping of the
# code) leaves every step's loss bit-identical. Each recipe is cut to a few steps; the
# multi-process rows run through torchrun as a user's would.
#   git worktree add /tmp/before <commit>
#   BEFORE=/tmp/before bash benchmarks/cpu/losses_before_after.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
BEFORE=${BEFORE:?the earlier checkout}
OUT=${1:?an output folder}
mkdir -p "$OUT"
rows=(
  "tiny_cpu|recipes/tiny_cpu.yaml|--set train.max_steps=6"
  "tiny_cpu_ddp2|recipes/tiny_cpu.yaml|--nproc 2 --set strategy=ddp-ds --set train.max_steps=6"
  "tiny_cpu_fsdp2|recipes/tiny_cpu.yaml|--nproc 2 --set strategy=fsdp --set train.max_steps=6"
  "tiny_lora|recipes/tiny_lora_cpu.yaml|--set train.max_steps=6"
  "tiny_llama_docs|recipes/tiny_llama_python_docs_cpu.yaml|--set train.max_steps=6"
  "tiny_llama_tp2|recipes/tiny_llama_python_docs_cpu.yaml|--nproc 2 --set strategy=tp --set train.max_steps=6"
  "tiny_llama_pp2|recipes/tiny_llama_python_docs_cpu.yaml|--nproc 2 --set strategy=pipeline --set train.max_steps=6"
  "gpt2_tiny|recipes/cases/gpt2_tiny_cpu.yaml|--set train.max_steps=6"
  "bert_mlm_tiny|recipes/cases/bert_mlm_tiny_cpu.yaml|--set train.max_steps=6"
  "bert_classify_tiny|recipes/cases/bert_classify_tiny_cpu.yaml|--set train.max_steps=6"
  "gan_mnist|recipes/cases/gan_mnist_cpu.yaml|--set train.max_steps=6"
  "mnist_classifier|recipes/cases/mnist_classifier_cpu.yaml|--set train.max_steps=6"
  "mobilenetv2_64|recipes/mnist_sample_mobilenetv2.yaml|--set precision=fp32 --set data.image_size=64 --set train.max_steps=4"
)
for row in "${rows[@]}"; do
  IFS='|' read -r name recipe args <<<"$row"
  for side in before after; do
    src=$([ "$side" = before ] && echo "$BEFORE/src" || echo "$PWD/src")
    dir="$OUT/$name/$side"; mkdir -p "$OUT/$name"
    # shellcheck disable=SC2086
    PYTHONPATH="$src" python3 -m paratrain run "$recipe" $args --set output_dir="$dir" \
      --overwrite >"$OUT/$name/$side.log" 2>&1 || echo "$name $side: exit $?" | tee -a "$OUT/failures.txt"
  done
done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = ["| run | steps | step losses identical | train_loss, held-out (result.json) identical | train_loss |",
         "|---|---:|---|---|---:|"]
def read(d, side):
    f, r = d / side / "steps.jsonl", d / side / "result.json"
    steps = [json.loads(l).get("loss") for l in f.read_text().splitlines()] if f.is_file() else None
    s = json.loads(r.read_text())["summary"] if r.is_file() else {}
    return steps, (s.get("train_loss"), s.get("val_loss"), s.get("held_out"))
for d in sorted(p for p in out.iterdir() if p.is_dir()):
    (a, sa), (b, sb) = read(d, "before"), read(d, "after")
    same = a is not None and a == b
    logged = "yes" if same and any(x is not None for x in b) else ("none logged" if same else "NO")
    lines.append(f"| {d.name} | {len(b or [])} | {logged} | {'yes' if sa == sb and sb[0] is not None else 'NO'} | {sb[0]} |")
(out / "losses.md").write_text("\n".join(lines) + "\n"); print("\n".join(lines))
PY
