"""The README's result tables are written by the benchmark scripts, between marker lines, never by hand."""

from __future__ import annotations

from pathlib import Path


def markers(script: str, name: str) -> tuple[str, str]:
    """The start and end marker lines of `name`'s block, written by `script --replot ... --readme README.md`."""
    return (
        f"<!-- {name}:start: written by `python {script} --replot ... --readme README.md` -->",
        f"<!-- {name}:end -->",
    )


def update_readme(path: Path, start: str, end: str, block: str) -> None:
    """Replace the text between the `start` and `end` marker lines of `path` with `block`."""
    text = path.read_text()
    if start not in text or end not in text:
        raise SystemExit(f"{path}: no result markers; add the two lines\n{start}\n{end}")
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{start}\n{block}\n{end}{tail}")
