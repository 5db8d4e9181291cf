"""The exponent g of progress per step ~ density**g, fitted on Top-k's frontier (the earlier link budget's constant).

    python -m benchmarks.studies.exponent results/simulate/frontier-mlp.jsonl \
        results/simulate/frontier-lenet5.jsonl

Reads ``benchmarks.simulate --out`` records. If progress per step grows like ``density ** g``,
the steps a run needs to reach an accuracy fall like ``density ** -g``. Per file, share of no
compression's final accuracy (same seed) and Top-k density (runs of compressor ``topk``), the
median over seeds of the steps to that accuracy gives one point when most seeds reach it; ``g``
is minus the least-squares slope of log steps on log density over those points.
"""
import argparse
import collections
import json
import math
import statistics

SHARES = (0.9, 0.95, 0.97)


def steps_to(records, target):
    """The first evaluation's step at or above ``target``, or None."""
    return next((r["step"] for r in sorted(records, key=lambda r: r["step"]) if r["test_acc"] >= target), None)


def points(records, share):
    """``[(density, median steps)]`` of the Top-k runs that most seeds bring to ``share`` of no
    compression's final accuracy."""
    runs = collections.defaultdict(list)
    for r in records:
        runs[(r["run"], r["seed"])].append(r)
    final = {seed: max(rs, key=lambda r: r["step"])["test_acc"] for (run, seed), rs in runs.items() if run == "none"}
    by_density = collections.defaultdict(list)
    for (run, seed), rs in runs.items():
        if rs[0]["compressor"] == "topk" and seed in final:
            by_density[rs[0]["options"]["ratio"]].append(steps_to(rs, share * final[seed]))
    out = []
    for density, steps in sorted(by_density.items()):
        reached = [s for s in steps if s is not None]
        if len(reached) > len(steps) / 2:
            out.append((density, statistics.median(reached)))
    return out


def fit(pts):
    """``g`` from ``[(density, steps)]``: minus the slope of log steps on log density."""
    xs, ys = [math.log(d) for d, _ in pts], [math.log(s) for _, s in pts]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    return -sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--shares", type=float, nargs="+", default=SHARES,
                   help="shares of no compression's final accuracy (low shares: the early phase)")
    args = p.parse_args(argv)
    print("| file | share of none's final accuracy | densities | g |\n|---|---|---|---|")
    for path in args.files:
        with open(path) as f:
            records = [json.loads(line) for line in f if line.strip()]
        for share in args.shares:
            pts = points(records, share)
            g = f"{fit(pts):.3f}" if len(pts) >= 3 else "too few points"
            print(f"| {path.rsplit('/', 1)[-1]} | {share:.0%} | {len(pts)} | {g} |")


if __name__ == "__main__":
    main()
