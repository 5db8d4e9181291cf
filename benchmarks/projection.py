"""Time to accuracy on a link, projected from simulated runs and the scaling model's step time.

    python -m benchmarks.projection FILE.jsonl [FILE.jsonl ...] [--rates 100mbit,20mbit]
        [--targets 0.95,0.99] [--scaling results/scaling.json]

``benchmarks.simulate`` gives, per run and seed, test accuracy every quarter epoch and the
bytes sent in that quarter, but no link. Here each quarter's steps are given the step time
``benchmarks.scaling`` predicts for 2 nodes: ``T_c + M / (eta B)`` for no compression and
``T_c + o_s + M / (ratio eta B)`` for a sparse run at that quarter's ratio, with ``T_c``,
``o_s`` and ``eta`` from the calibration file and ``M`` the model's dense gradient bytes. A run
reaches a target at the first evaluation at or above that share of no compression's final
accuracy, same seed. Every sparse method gets the same ``T_c`` and ``o_s``: what separates
them is how many steps they need and what they send per step. A projection, not a
measurement: ``make demo`` measures time to accuracy on the shaped link.
"""
import argparse
import collections
import dataclasses
import json
import statistics

from benchmarks import scaling
from benchmarks.records import read_jsonl


def constants(path, model):
    """The calibration of ``path`` (``scaling.json``) with the dense gradient bytes of
    ``model`` on mnist5k's 28x28 digits, as ``benchmarks.simulate`` trains it."""
    from harness.models import DIGITS, build_model
    with open(path) as f:
        c = scaling.Constants(**json.load(f)["constants"])
    params = build_model(model, DIGITS, 10).count_params()
    return dataclasses.replace(c, model=model, dense_bytes=4.0 * params)


def reach(records, c, bandwidth, target):
    """(seconds, steps) at which the run's records (one seed, in order) first reach accuracy
    ``target`` on a link of ``bandwidth`` bytes/s; (None, None) when they never do."""
    seconds, last = 0.0, 0
    for r in records:
        if r["ratio"]:
            sparse = dataclasses.replace(c, sparse_bytes=c.dense_bytes / r["ratio"], small_bytes=0.0)
            step = scaling.step_time(sparse, "sparse", 2, bandwidth)
        else:
            step = scaling.step_time(c, "dense", 2, bandwidth)
        seconds, last = seconds + (r["step"] - last) * step, r["step"]
        if r["test_acc"] >= target:
            return seconds, last
    return None, None


def projections(records, constants_of, rates, targets):
    """Rows per model, rate, target and run: seeds that reach it, median seconds and steps."""
    runs = collections.defaultdict(list)
    for r in records:
        runs[(r["model"], r["run"], r["seed"])].append(r)
    rows = []
    for model in sorted({r["model"] for r in records}):
        c = constants_of(model)
        final = {s: rs[-1]["test_acc"] for (m, n, s), rs in runs.items() if m == model and n == "none"}
        seeds = sorted(final)
        names = sorted({n for m, n, _ in runs if m == model})
        for label in rates:
            for share in targets:
                for name in names:
                    hits = [reach(runs[(model, name, s)], c, scaling.rate_bytes(label), share * final[s])
                            for s in seeds]
                    hits = [h for h in hits if h[0] is not None]
                    rows.append({"model": model, "link": label, "target": share, "run": name,
                                 "seeds": len(seeds), "reached": len(hits),
                                 "seconds": statistics.median(h[0] for h in hits) if hits else None,
                                 "steps": statistics.median(h[1] for h in hits) if hits else None})
    return rows


def table(rows):
    """Markdown, fastest first within each model, link and target; unreached runs last."""
    lines = ["| model | link | target | run | seeds reaching it | median s | median steps |",
             "|---|---|---|---|---|---|---|"]
    order = lambda r: (r["model"], r["link"], r["target"], r["seconds"] is None, r["seconds"] or 0)
    for r in sorted(rows, key=order):
        s = "–" if r["seconds"] is None else f"{r['seconds']:.1f}"
        steps = "–" if r["steps"] is None else f"{r['steps']:.0f}"
        lines.append(f"| {r['model']} | {r['link']} | {r['target']:.0%} | {r['run']} | "
                     f"{r['reached']}/{r['seeds']} | {s} | {steps} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--rates", default="100mbit,20mbit")
    p.add_argument("--targets", default="0.95,0.99", help="shares of no compression's final accuracy")
    p.add_argument("--scaling", default="results/scaling.json")
    args = p.parse_args(argv)
    rates = args.rates.split(",")
    bad = [r for r in rates if scaling.rate_bytes(r) is None]
    if bad:
        p.error(f"--rates: {bad} are not tc rates such as 100mbit")
    records = [r for path in args.files for r in read_jsonl(path)]
    rows = projections(records, lambda m: constants(args.scaling, m), rates, [float(t) for t in args.targets.split(",")])
    print(table(rows))


if __name__ == "__main__":
    main()
