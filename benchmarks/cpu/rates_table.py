"""matmul_shapes.py's rows (one GPU's sweep) -> the compact rates table a hardware profile
names in [tables] (src/paratrain/forecast/analytic/rates.py reads it): each GEMM shape once
(a shape measured under several names is one row), float8 tensorwise as "float8" (torchao's
default recipe, torchtitan's), rowwise as "float8_rowwise"; attention by backend, head dim,
a rank's heads and sequence, forward and backward.
    python3 benchmarks/cpu/rates_table.py RESULTS/matmul_shapes.json [MORE.json ...] OUT.json "source text"
Several sweeps: a GEMM shape or an attention backend is taken from the first file that measured
it (a later call adds what the first lacks, e.g. --attention-only's <backend>_gqa rows).
"""

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

*inputs, out_path, source = sys.argv[1:] if len(sys.argv) > 3 else sys.exit(__doc__)
if out_path in inputs or out_path.endswith("matmul_shapes.json") or source.endswith(".json"):
    sys.exit(f"rates_table.py: {out_path} would overwrite a sweep (the source text missing?)")
gemm, att = defaultdict(list), defaultdict(lambda: defaultdict(list))
seen, rows = set(), []
for path in inputs:
    earlier = {r["backend"] for r in rows if r["kind"] == "attention"}
    rows += [
        r
        for r in json.loads(Path(path).read_text())["rows"]
        if r["kind"] != "attention" or r["backend"] not in earlier
    ]
for r in rows:
    if r["kind"] == "gemm" and not r.get("shared"):
        dtype = (
            r["dtype"]
            if r["dtype"] == "bf16"
            else ("float8" if r.get("scaling") == "tensorwise" else "float8_rowwise")
        )
        key = (dtype, r["M"], r["N"], r["K"])
        if key in seen:
            continue
        seen.add(key)
        gemm[dtype].append([r["M"], r["N"], r["K"], round(r["tflops"], 1)])
    elif r["kind"] == "attention":
        att[r["backend"]][(r["head_dim"], r["heads"], r["seq"])].append((r["pass"], r["tflops"]))
attention = {
    b: [
        [
            hd,
            h,
            s,
            round(statistics.median(t for p, t in v if p == "forward"), 1),
            round(statistics.median(t for p, t in v if p == "backward"), 1),
        ]
        for (hd, h, s), v in sorted(points.items())
    ]
    for b, points in att.items()
}
out = {
    "source": source,
    "gemm": {k: sorted(v) for k, v in gemm.items()},
    "attention": attention,
}
Path(out_path).write_text(json.dumps(out, separators=(",", ":")) + "\n")
print({k: len(v) for k, v in gemm.items()}, {k: len(v) for k, v in attention.items()})
