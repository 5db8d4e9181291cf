"""Step time against density without a link: the median step of each run of a ``--local`` matrix.

    python -m benchmarks.tta --local --results results/local-steps --models mlp --seeds 0 \
        --budget 200 --methods "gp-0.1%=gradpart,density_ceiling=0.001,density_floor=0.001,follow_link=False" ...
    python -m benchmarks.local_steps results/local-steps

Both ranks run on this machine over loopback, so a step is compute and the method's own work:
what each sent value costs in CPU, apart from any link. Reads each run's ``.steps.jsonl``
(``scripts/train.py``'s per-step records), leaves out the first ``--skip`` steps (tracing,
compiling, warm-up), and writes one row per run to ``<results>/steps.md`` and ``steps.json``:
the median step and its interquartile range, the run's mean density (values sent over values
exchanged, from its last record's compression totals; float32 gradients) and the ratio against
the method named ``--base``.
"""
import argparse
import json
import statistics
from pathlib import Path

from benchmarks.records import read_jsonl


def summary(path, skip):
    """One run's row from its ``.steps.jsonl``: step ms (median, quartiles), and its mean density
    from the run's records beside it (None for a dense method)."""
    records = read_jsonl(path)[skip:]
    if len(records) < 4:
        raise SystemExit(f"local_steps: {path} has {len(records)} steps after the first {skip}: run longer")
    ms = sorted(1e3 * r["interval_s"] for r in records)
    q1, median, q3 = statistics.quantiles(ms, n=4)
    run = path.name[:-len(".steps.jsonl")]
    totals = read_jsonl(path.with_name(run + ".jsonl"))[-1].get("compression") or {}
    dense_bytes = totals.get("total_dense_bytes")
    density = 4 * totals["total_sent_elements"] / dense_bytes if dense_bytes else None
    return {"run": run, "steps": len(records), "step_ms": median, "q1_ms": q1, "q3_ms": q3, "density": density,
            "ratio": totals.get("compression_ratio")}


def table(rows, base):
    """Markdown: one row per run, its median step against ``base``'s."""
    ref = next((r["step_ms"] for r in rows if r["run"].startswith(base + "-seed")), None)
    lines = [f"| run | steps | median step ms (IQR) | density | compression ratio | vs {base} |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        density = "" if r["density"] is None else f"{100 * r['density']:.2f} %"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.0f}x"
        against = f"{r['step_ms'] / ref:.2f}x" if ref else ""
        lines.append(f"| {r['run']} | {r['steps']} | {r['step_ms']:.1f} ({r['q1_ms']:.1f}-{r['q3_ms']:.1f}) "
                     f"| {density} | {ratio} | {against} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results", type=Path, help="a benchmarks.tta --local results folder")
    p.add_argument("--skip", type=int, default=10, help="first steps left out")
    p.add_argument("--base", default="none", help="the method the others are set against")
    args = p.parse_args()
    paths = sorted(args.results.glob("*/localhost/*.steps.jsonl"))
    if not paths:
        raise SystemExit(f"local_steps: no */localhost/*.steps.jsonl under {args.results}: run benchmarks.tta --local")
    rows = [summary(path, args.skip) for path in paths]
    (args.results / "steps.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.results / "steps.md").write_text(table(rows, args.base))
    print(table(rows, args.base), end="")


if __name__ == "__main__":
    main()
