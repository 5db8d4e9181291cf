"""Accuracy at matched bytes: each run against Top-k's accuracy-ratio frontier.

    python -m benchmarks.frontier FILE.jsonl [FILE.jsonl ...]

Reads ``benchmarks.simulate --out`` records. Per model, seed and evaluation, the runs of
compressor ``topk`` (at several ``ratio`` settings) give points (log compression ratio so
far, test accuracy); every other run's accuracy is compared with the frontier's, linearly
interpolated in log ratio at that run's own ratio so far (the bytes it has spent), same seed
and evaluation. A positive cell means more accurate than Top-k for the same bytes. Cells are
mean +- half range over the seeds; ``beyond`` when the run's ratio lies outside the Top-k
ratios of some seed (no interpolation, no extrapolation). A second table gives every
compressed run's accuracy less no compression's (run ``none``), same seed and evaluation.
"""
import argparse
import bisect
import collections
import json
import math
import statistics


def load(paths):
    """Every record of the files."""
    return [json.loads(line) for path in paths for line in open(path) if line.strip()]


def frontier_at(points, ratio):
    """Top-k accuracy interpolated at ``ratio`` from ``points`` [(ratio, acc)]; None outside them."""
    points = sorted((math.log(r), a) for r, a in points)
    x = math.log(ratio)
    xs = [p[0] for p in points]
    if not points or x < xs[0] or x > xs[-1]:
        return None
    i = min(bisect.bisect_left(xs, x), len(points) - 1)
    if xs[i] == x or i == 0:
        return points[i][1]
    (x0, a0), (x1, a1) = points[i - 1], points[i]
    return a0 + (a1 - a0) * (x - x0) / (x1 - x0)


def gaps(records):
    """``{(model, run): {epoch: [(accuracy - frontier or None, ratio) per seed]}}``."""
    topk = collections.defaultdict(list)
    for r in records:
        if r["compressor"] == "topk" and r["ratio_total"]:
            topk[(r["model"], r["seed"], r["epoch"])].append((r["ratio_total"], r["test_acc"]))
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        if r["compressor"] == "topk" or not r["ratio_total"]:
            continue
        front = frontier_at(topk[(r["model"], r["seed"], r["epoch"])], r["ratio_total"])
        out[(r["model"], r["run"])][r["epoch"]].append(
            (None if front is None else r["test_acc"] - front, r["ratio_total"]))
    return out


def gaps_to_none(records):
    """``{(model, run): {epoch: [(accuracy - none's, ratio) per seed]}}`` for runs with a ratio."""
    none = {(r["model"], r["seed"], r["epoch"]): r["test_acc"] for r in records if r["compressor"] == "none"}
    out = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in records:
        key = (r["model"], r["seed"], r["epoch"])
        if r["ratio_total"] and key in none:
            out[(r["model"], r["run"])][r["epoch"]].append((r["test_acc"] - none[key], r["ratio_total"]))
    return out


def cell(values):
    """``mean±half range`` in points, or ``beyond``."""
    if any(v is None for v, _ in values):
        return "beyond"
    d = [100 * v for v, _ in values]
    return f"{statistics.mean(d):+.1f}±{(max(d) - min(d)) / 2:.1f}"


def table(by_run, epochs=(1, 2, 3), against="Top-k"):
    """Markdown: per model and run, the ratio so far and the gap (``gaps`` or ``gaps_to_none``)
    at ``epochs``."""
    lines = ["| model | run | seeds | " + " | ".join(f"ep {e}: ratio, pp vs {against}" for e in epochs) + " |",
             "|---|---|---|" + "---|" * len(epochs)]
    for (model, run), by_epoch in sorted(by_run.items()):
        cells = []
        for e in epochs:
            values = by_epoch.get(float(e), [])
            cells.append(f"{statistics.mean(r for _, r in values):.0f}x, {cell(values)}" if values else "–")
        seeds = max(len(v) for v in by_epoch.values())
        lines.append(f"| {model} | {run} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--epochs", default="1,2,3", help="comma-separated evaluations to show")
    args = p.parse_args(argv)
    records, epochs = load(args.files), tuple(int(e) for e in args.epochs.split(","))
    print(table(gaps(records), epochs))
    print()
    print(table(gaps_to_none(records), epochs, "none"))


if __name__ == "__main__":
    main()
