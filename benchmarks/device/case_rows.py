"""One case study's rows as a markdown table: NAME=result.json pairs, the first is the reference.
Throughput is tokens/s when the rows count tokens, else unique samples/s; the plain loops write
no MFU, so theirs uses the model FLOPs per token and the peak that paratrain's row of the same
model reports (the same model, the same formula).

    python benchmarks/device/case_rows.py "plain eager=/tmp/a/result.json" "paratrain=/tmp/b/result.json"
"""

import json
import sys
from pathlib import Path


def main() -> None:
    rows = []
    for arg in sys.argv[1:]:
        name, path = arg.split("=", 1)
        if not Path(path).is_file():
            rows.append((name, None))
            continue
        rows.append((name, json.loads(Path(path).read_text())["summary"]))
    basis = next((s["mfu_basis"] for _, s in rows if s and s.get("mfu_basis")), None)
    tokens = any(s and s.get("tokens_per_s") for _, s in rows)
    unit = "tokens/s" if tokens else "samples/s"
    ref = next((s for _, s in rows if s), None)
    key = "tokens_per_s" if tokens else "unique_samples_per_s"
    print(f"| row | {unit} | vs {rows[0][0]} | ms/step | MFU | peak GiB | loss |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, s in rows:
        if s is None:
            print(f"| {name} | failed | | | | | |")
            continue
        rate = s[key]
        mfu = s.get("mfu")
        if mfu is None and basis and tokens and basis.get("peak_flops_bf16_dense"):
            mfu = basis["model_flops_per_token"] * rate / basis["peak_flops_bf16_dense"]
        mfu_txt = f"{mfu:.1%}" if mfu else "-"
        print(
            f"| {name} | {rate:,.0f} | {rate / ref[key]:.2f}x | {s['step_time_s'] * 1000:.1f} | "
            f"{mfu_txt} | {s['peak_memory_bytes'] / 2**30:.1f} | {s.get('train_loss', 0):.4f} |"
        )


if __name__ == "__main__":
    main()
