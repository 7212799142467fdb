"""The benchmarks' summary tables are written by the benchmark scripts between marker lines, never by hand.

They live in docs/benchmarks.md (section "Summary tables"; the README's Results section points there and quotes a few
of their numbers): each script's `--readme` argument takes that page, `--replot JSON --readme docs/benchmarks.md`.
The argument keeps its name; any Markdown file with the two marker lines works (the tests use a temporary one)."""

from __future__ import annotations

from pathlib import Path


def markers(script: str, name: str) -> tuple[str, str]:
    """The start and end marker lines of `name`'s block, written by `script --replot ... --readme
    docs/benchmarks.md`."""
    return (
        f"<!-- {name}:start: written by `python {script} --replot ... --readme docs/benchmarks.md` -->",
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


def replot(path: Path, out: Path | None, render, readme: Path | None, start: str, end: str, block, load=None) -> None:
    """A benchmark's `--replot`: re-render its tables and plots from the JSON at `path` into `out` (default: the
    JSON's folder) and, with `readme` (docs/benchmarks.md), rewrite that page's block between `start` and `end` with
    `block(results)`.
    `load` reads the JSON (default: as it is)."""
    import json

    results = load(path) if load is not None else json.loads(path.read_text())
    out = out or path.parent
    out.mkdir(parents=True, exist_ok=True)
    print(render(results, out))
    if readme:
        update_readme(readme, start, end, block(results))
