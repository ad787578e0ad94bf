"""`paratrain report --format html`: a real page (headings, tables, lists, inline code, the
plots embedded, one file that opens offline), read back by Python's HTML parser and, where
Chromium is installed, by a real browser; and the loss curves the report draws."""

import base64
import json
import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from test_bench_report import row

from paratrain.bench import plots
from paratrain.bench.execute import loss_curve
from paratrain.bench.render import to_html
from paratrain.bench.report import build_report, group_rows


class Page(HTMLParser):
    """Tags in order, the text of each, and the images' sources."""

    def __init__(self):
        super().__init__()
        self.tags, self.text, self.images, self.stack = [], {}, [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.stack.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_endtag(self, tag):
        while self.stack and self.stack.pop() != tag:
            pass

    def handle_data(self, data):
        if self.stack:
            self.text.setdefault(self.stack[-1], []).append(data)


def curved(key, label, thr, curve):
    r = row(key, label=label, thr=thr)
    r.result = {"curve": curve}
    return r


@pytest.fixture
def page(tmp_path):
    rows = [
        curved("a", "fast", 200.0, [[10, 2.0], [20, 1.5], [30, 1.4]]),
        curved("b", "careful", 100.0, [[10, 2.0], [20, 1.2], [30, 0.9]]),
    ]
    data = {"s": ("variants", {"reference": "careful"}, rows)}
    tables, preamble = build_report(data)
    made = plots.plots_for("variants", "s", group_rows(rows), tmp_path / "plots")
    text = to_html(tables, preamble, {tables[0].title: made})
    parsed = Page()
    parsed.feed(text)
    return text, parsed, tables, made


def test_html_report_is_one_page_with_rendered_marks_and_embedded_plots(page):
    text, parsed, tables, made = page
    assert parsed.tags.count("h1") == 1 and parsed.tags.count("h2") == len(tables)
    assert parsed.tags.count("table") == len(tables) and "ul" in parsed.tags
    # Markdown's marks are rendered, not shown: the sweep's name is code, no backtick is text
    assert "s" in parsed.text["code"]
    assert not any("`" in t for ts in parsed.text.values() for t in ts)
    # the plots are inside the page (offline), each a PNG, the loss curves among them
    assert {p.name for p in made} >= {"s_loss.png", "s_throughput.png"}
    assert len(parsed.images) == len(made)
    for src in parsed.images:
        head, data = src.split(",", 1)
        assert head == "data:image/png;base64"
        assert base64.b64decode(data)[:4] == b"\x89PNG"
    assert "http" not in text.replace("http-equiv", "")  # nothing fetched from elsewhere


def test_loss_curves_plot_one_line_per_configuration(tmp_path, monkeypatch):
    seen = {}
    real = plots.plt.subplots

    def spy(*args, **kwargs):
        fig, ax = real(*args, **kwargs)
        seen["ax"] = ax
        return fig, ax

    monkeypatch.setattr(plots.plt, "subplots", spy)
    groups = group_rows(
        [curved("a", "fast", 1.0, [[1, 3.0], [2, 2.0]]), curved("b", "slow", 1.0, [[1, 3.0]])]
    )
    path = plots.loss_curves_plot(groups, tmp_path / "loss.png", "s")
    lines = seen["ax"].get_lines()
    # a one-point curve is no curve: left out
    assert path.is_file() and [line.get_label() for line in lines] == ["fast x1"]
    assert list(lines[0].get_ydata()) == [3.0, 2.0]


def test_a_runs_loss_curve_is_its_step_log_or_its_peers_losses(tmp_path):
    (tmp_path / "steps.jsonl").write_text(
        json.dumps({"step": 10, "loss": 2.5})
        + "\n"
        + json.dumps({"step": 20, "loss": None})  # a pipeline's first stage: no loss
        + "\n"
        + '{"step": 30, "lo'  # cut short by a kill
    )
    assert loss_curve(tmp_path, {}) == [[10, 2.5]]
    peer = {"summary": {"losses": [3.0, 2.0]}}
    assert loss_curve(tmp_path / "none", peer) == [[1, 3.0], [2, 2.0]]
    # a peer's per-step losses as paratrain logs them: the mean since the last point, every
    # log.every_steps (the last, shorter interval at its own last step)
    every = {
        "summary": {"losses": [4.0, 2.0, 3.0, 1.0, 5.0]},
        "config": {"log": {"every_steps": 2}},
    }
    assert loss_curve(tmp_path / "none", every) == [[2, 3.0], [4, 2.0], [5, 5.0]]
    # a loss that stopped being a number (NaN is written as null): the curve ends before it
    nan = {"summary": {"losses": [4.0, 2.0, 3.0, None, 5.0]}, "config": every["config"]}
    assert loss_curve(tmp_path / "none", nan) == [[2, 3.0], [3, 3.0]]
    assert loss_curve(tmp_path / "none", {"summary": {"losses": [float("nan")]}}) == []


CHROMIUM = next((c for c in ("chromium", "chromium-browser") if shutil.which(c)), None)


# CI installs Chromium and asks for it (.ci/run): there a missing browser fails the test
REQUIRED = os.environ.get("PARATRAIN_REQUIRE_BROWSER") == "1"


@pytest.mark.skipif(
    CHROMIUM is None and not REQUIRED, reason="needs Chromium (apt install chromium)"
)
def test_a_real_browser_renders_the_tables_and_the_plots(page, tmp_path):
    assert CHROMIUM, "PARATRAIN_REQUIRE_BROWSER=1 but no chromium on the PATH"
    text, _, tables, made = page
    html_file = tmp_path / "report.html"
    html_file.write_text(text)
    # no background connections: a closed network refuses them, many at a time
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    flags += ["--disable-background-networking", "--disable-component-update", "--no-first-run"]
    flags += [f"--user-data-dir={tmp_path / 'profile'}"]
    # the DOM after the browser loaded it: every table row there, every image decoded (a
    # broken data URI has naturalWidth 0), read back through the page's own title
    probe = tmp_path / "probe.html"
    probe.write_text(
        text.replace(
            "</body>",
            "<script>window.onload=()=>{document.title=JSON.stringify({rows:"
            "document.querySelectorAll('tr').length,images:[...document.images]"
            ".map(i=>i.naturalWidth)})}</script></body>",
        )
    )
    dom = subprocess.run(
        [*flags, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    seen = json.loads(dom.split("<title>", 1)[1].split("</title>", 1)[0].replace("&quot;", '"'))
    assert seen["rows"] == sum(len(t.rows) + 1 for t in tables)
    assert len(seen["images"]) == len(made) and all(w > 100 for w in seen["images"])
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1200,900", html_file.as_uri()],
        capture_output=True,
        timeout=120,
    )
    assert shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 10_000
