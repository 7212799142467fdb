"""The unbiased pass@k estimator and its per-benchmark summary."""

from __future__ import annotations

import math


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: `1 - C(n-c, k) / C(n, k)`, computed as the product
    `1 - prod_{i=n-c+1}^{n} (1 - k/i)`, which stays exact in floating point for n in the thousands."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def summarize(records: list[dict], ks: list[int]) -> dict:
    """pass@k averaged over problems; problems whose gold answer does not parse (reward None) are skipped."""
    by_problem: dict[int, list[dict]] = {}
    for record in records:
        by_problem.setdefault(record["problem"], []).append(record)
    scored = {p: rs for p, rs in by_problem.items() if all(r["reward"] is not None for r in rs)}
    summary = {"problems": len(scored), "skipped": len(by_problem) - len(scored)}
    summary["samples"] = min((len(rs) for rs in scored.values()), default=0)
    for k in ks:
        values = [pass_at_k(len(rs), sum(r["correct"] for r in rs), k) for rs in scored.values()]
        summary[f"pass@{k}"] = sum(values) / len(values) if values else None
    rewards = [r["reward"] for rs in scored.values() for r in rs]
    summary["mean_reward"] = sum(rewards) / len(rewards) if rewards else None
    return summary


def format_table(rows: dict[str, dict], ks: list[int], first_column: str = "benchmark") -> str:
    """One row per benchmark (or checkpoint), pass@k in percent."""
    header = [first_column, "problems", "samples", *(f"pass@{k}" for k in ks)]
    table = [header]
    for name, s in rows.items():
        cells = [f"{100 * s[f'pass@{k}']:.1f}" if s[f"pass@{k}"] is not None else "-" for k in ks]
        table.append([name, str(s["problems"]), str(s["samples"]), *cells])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
        for row in table
    )
