#!/usr/bin/env bash
# The README's picture of the HTML report: the CPU sweep a user can try (recipes/bench/cpu_smoke.yaml,
# 1 and 2 processes, longer so that the loss curves have points), its HTML report, and a
# screenshot of that page in headless Chromium (apt install chromium).
#   bash benchmarks/report_screenshot.sh        # -> docs/img/report.png, docs/img/report.html
set -euo pipefail
OUT=${OUT:-docs/img}; mkdir -p "$OUT"
work=$(mktemp -d)
paratrain bench recipes/bench/cpu_smoke.yaml --db "$work/r.db" --runs-dir "$work/runs" --no-progress \
  --set train.max_steps=80 --set log.every_steps=4 --set data.limit_samples=2048
paratrain report --db "$work/r.db" --format html --out "$OUT/report.html"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1100,1700 \
  --screenshot="$OUT/report.png" "file://$(realpath "$OUT/report.html")"
echo "screenshot: $OUT/report.png"
