"""Tables as data (title, headers, rows, notes), rendered to Markdown, CSV or HTML."""

from __future__ import annotations

import base64
import csv
import html
import io
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def to_markdown(tables: list[Table], preamble: list[str]) -> str:
    out = [*preamble, ""]
    for t in tables:
        out += [f"## {t.title}", ""]
        out.append("| " + " | ".join(t.headers) + " |")
        out.append("|" + "---|" * len(t.headers))
        out += ["| " + " | ".join(r) + " |" for r in t.rows]
        if t.notes:
            out.append("")
            out += [f"- {n}" for n in t.notes]
        out.append("")
    return "\n".join(out)


def to_csv(tables: list[Table]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    for t in tables:
        w.writerow([t.title])
        w.writerow(t.headers)
        w.writerows(t.rows)
        w.writerow([])
    return buf.getvalue()


_INLINE = re.compile(r"`([^`]+)`|\*\*([^*]+)\*\*")
_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;"
    "color:#222;line-height:1.45}h1{font-size:1.6em}h2{font-size:1.2em;margin-top:2em;"
    "border-bottom:1px solid #ddd;padding-bottom:.2em}table{border-collapse:collapse;"
    "margin:.8em 0;font-size:.92em}td,th{border:1px solid #ccc;padding:4px 8px;"
    "text-align:right;vertical-align:top}th{background:#f4f4f4}td:first-child,"
    "th:first-child{text-align:left}tr:nth-child(even) td{background:#fafafa}"
    "code{background:#f1f1f1;padding:0 .25em;border-radius:3px;font-size:.92em}"
    "figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}"
    "figcaption{color:#666;font-size:.85em}.notes{color:#444;font-size:.92em}"
)


def inline(text: str) -> str:
    """The report's Markdown inline marks as HTML (the rest escaped): `code`, **bold**."""
    out, at = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[at : m.start()]))
        code, bold = m.groups()
        out.append(f"<code>{html.escape(code)}</code>" if code else f"<b>{html.escape(bold)}</b>")
        at = m.end()
    out.append(html.escape(text[at:]))
    return "".join(out)


def _blocks(lines: list[str]) -> list[str]:
    """Markdown lines (headings, "- " bullets, paragraphs) as HTML blocks."""
    parts, bullets = [], []

    def close():
        if bullets:
            parts.append("<ul>" + "".join(f"<li>{b}</li>" for b in bullets) + "</ul>")
            bullets.clear()

    for line in lines:
        if line.startswith("- "):
            bullets.append(inline(line[2:]))
            continue
        close()
        if line.startswith("# "):
            parts.append(f"<h1>{inline(line[2:])}</h1>")
        elif line.strip():
            parts.append(f"<p>{inline(line)}</p>")
    close()
    return parts


def _image(path: Path) -> str:
    """A PNG inside the page (a data URI): the report is one file that opens offline."""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return (
        f"<figure><img alt='{html.escape(path.stem)}' src='data:image/png;base64,{data}'>"
        f"<figcaption>{html.escape(path.name)}</figcaption></figure>"
    )


def to_html(
    tables: list[Table], preamble: list[str], images: dict[str, list[Path]] | None = None
) -> str:
    """One self-contained page: the preamble, each table under its heading with its notes, and
    the plots of each table (images: table title -> PNGs) embedded under it."""
    images = images or {}
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width, initial-scale=1'>",
        f"<title>paratrain report</title><style>{_STYLE}</style></head><body>",
        *_blocks(preamble),
    ]
    for t in tables:
        parts.append(f"<h2>{inline(t.title)}</h2><table><thead><tr>")
        parts += [f"<th>{inline(h)}</th>" for h in t.headers]
        parts.append("</tr></thead><tbody>")
        for r in t.rows:
            parts.append("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in r) + "</tr>")
        parts.append("</tbody></table>")
        if t.notes:
            parts.append(
                "<ul class='notes'>" + "".join(f"<li>{inline(n)}</li>" for n in t.notes) + "</ul>"
            )
        parts += [_image(p) for p in images.get(t.title, [])]
    parts.append("</body></html>")
    return "\n".join(parts)
