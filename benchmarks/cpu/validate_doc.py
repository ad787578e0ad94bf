"""Writes `paratrain plan --validate published --terms` into docs/tune-plan.md between its
validate markers, so the page shows the suite as the code prices it today.

    python benchmarks/cpu/validate_doc.py
"""

from __future__ import annotations

from pathlib import Path

from paratrain.forecast.analytic import validate

DOC = Path(__file__).parents[2] / "docs" / "tune-plan.md"
BEGIN, END = "<!-- validate:begin -->", "<!-- validate:end -->"


def main() -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    found = validate.table(validate.run("published"), terms=True)
    DOC.write_text(f"{head}{BEGIN}\n{found}\n{END}{tail}")
    print(f"{DOC}: {validate.run('published')['summary']}")


if __name__ == "__main__":
    main()
