"""Tables as data (title, headers, rows, notes), rendered to Markdown, CSV or HTML."""

from __future__ import annotations

import csv
import html
import io
from dataclasses import dataclass, field


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


def to_html(tables: list[Table], preamble: list[str]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>paratrain report</title>",
        "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
        "text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}</style></head><body>",
    ]
    parts += [f"<p>{html.escape(p.lstrip('# '))}</p>" for p in preamble if p.strip()]
    for t in tables:
        parts.append(f"<h2>{html.escape(t.title)}</h2><table><tr>")
        parts += [f"<th>{html.escape(h)}</th>" for h in t.headers]
        parts.append("</tr>")
        for r in t.rows:
            parts.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
        parts.append("</table>")
        if t.notes:
            parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in t.notes) + "</ul>")
    parts.append("</body></html>")
    return "\n".join(parts)
