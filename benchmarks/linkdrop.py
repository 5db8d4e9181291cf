"""A link that drops mid-run: how each method's step time follows it, all methods in one run.

    python -m benchmarks.linkdrop                                  # MLP, 100 -> 10 Mbit/s
    python -m benchmarks.linkdrop --model lenet5 --methods gradpart topk none --seeds 0 1 2

Each method trains ``--steps`` steps (``scripts/train.py``, every step logged) on the two-node edge
cluster shaped at ``--before``; once ``--drop-at`` steps are logged the driver re-shapes every
node to ``--after`` (``scripts/edge_cluster.sh rate``, as a link that slows under a running job),
and shapes it back before the next launch. Per run it reports the median step time over the
``WINDOW`` steps before the drop, the median over ``WINDOW`` steps centred ``AFTER`` steps past it
(the issue's "50 steps after the drop"), their ratio, the steps until a trailing ``WINDOW``-step
median is back within ``RECOVERED`` times the time before, and, for a method that follows the link,
the density it sent and its dense/sparse mode on each side. Results go to
``results/linkdrop/<model>-<before>-<after>/``: every run's per-step records, its log,
``summary.json`` and ``summary.md``. Runs hold the cluster lock, as ``benchmarks.tta``'s do.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks import tta_plan as tp
from benchmarks.cluster import HOSTS, Cluster, train_launch
from benchmarks.records import markdown
from harness import methods

RESULTS = tp.ROOT / "results" / "linkdrop"
WINDOW = 20      # steps in each median
AFTER = 50       # where the "after" window is centred, in steps past the drop
RECOVERED = 1.5  # a trailing median within this factor of the time before counts as recovered


def drop_run(method, args, folder, seed):
    """One launch: trains at ``args.before``, re-shapes to ``args.after`` once ``args.drop_at``
    steps are logged; returns the step at which the new rate took effect."""
    steps = folder / f"{method.name}-seed{seed}.steps.jsonl"
    steps.unlink(missing_ok=True)
    train = ["--model", args.model, "--dataset", "mnist5k", *methods.train_args(method.compressor, method.options),
             "--seed", str(seed), "--epochs", "1000", "--eval-every", "1", "--max-steps", str(args.steps),
             "--steps-jsonl", str(steps), "--log-every-steps", "1"]
    dropped = None
    with train_launch(train, HOSTS["edge"], steps.with_suffix("").with_suffix(".log")) as proc:
        while proc.poll() is None:
            if dropped is None and count_lines(steps) >= args.drop_at:
                Cluster.script("rate", args.after)
                dropped = count_lines(steps) + 1  # the step in flight spans the change
            time.sleep(0.05)
    if proc.returncode != 0 or dropped is None:
        sys.exit(f"linkdrop: {method.name} seed {seed} failed (exit {proc.returncode}, "
                 f"{count_lines(steps)} steps logged): see {steps.with_suffix('').with_suffix('.log')}")
    return dropped


def count_lines(path):
    return sum(1 for _ in open(path)) if path.exists() else 0


def analyse(records, dropped):
    """The figures of one run: step times before and after the drop, recovery, link state."""
    times = [r["interval_s"] for r in records]
    before = times[dropped - 1 - WINDOW:dropped - 1]
    start = dropped + AFTER - WINDOW // 2
    after = times[start:start + WINDOW]
    if len(before) < WINDOW or len(after) < WINDOW:
        raise ValueError(f"too few steps around the drop at step {dropped}: run more --steps")
    base = statistics.median(before)
    first = dropped - 1  # the index of the step in flight at the change
    recovered = next((i - first for i in range(first + WINDOW, len(times) + 1)
                      if statistics.median(times[i - WINDOW:i]) <= RECOVERED * base), None)
    link = lambda rs: [r["link"] for r in rs if "link" in r]
    side = lambda rs: {"density": statistics.median(s["density"] for s in rs),
                       "dense_steps": sum(s["dense"] for s in rs)} if rs else {}
    return {"dropped_at_step": dropped, "before_s": base, "after_s": statistics.median(after),
            "ratio": statistics.median(after) / base, "recovered_after_steps": recovered,
            "worst_after_s": max(times[dropped:]), "link_before": side(link(records[dropped - 1 - WINDOW:dropped - 1])),
            "link_after": side(link(records[start:start + WINDOW]))}


def table(rows):
    columns = [("method", "method", "s"), ("seed", "seed", "d"), ("step before, ms", "before_ms", ".1f"),
               (f"step {AFTER} after, ms", "after_ms", ".1f"), ("after / before", "ratio", ".2f"),
               (f"steps to <= {RECOVERED:g}x", "recovered_after_steps", "d"),
               ("slowest after, ms", "worst_after_ms", ".0f"),
               ("density before", "density_before", ".3%"), ("density after", "density_after", ".3%")]
    ms = lambda r, key: 1e3 * r[key]
    flat = [{**r, "before_ms": ms(r, "before_s"), "after_ms": ms(r, "after_s"), "worst_after_ms": ms(r, "worst_after_s"),
             "density_before": r["link_before"].get("density"), "density_after": r["link_after"].get("density")}
            for r in rows]
    return markdown(flat, columns)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="mlp", choices=tp.MODELS)
    p.add_argument("--methods", nargs="+", default=["gradpart", "topk", "powersgd"], metavar="METHOD",
                   help="as benchmarks.tta takes them (registered, grid or NAME=COMPRESSOR[,KEY=VALUE...])")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--before", default="100mbit", help="the link's rate at the start")
    p.add_argument("--after", default="10mbit", help="its rate from --drop-at on")
    p.add_argument("--drop-at", type=int, default=150, help="steps logged before the link drops")
    p.add_argument("--steps", type=int, default=300, help="steps per run")
    p.add_argument("--results", type=lambda s: Path(s).resolve(), default=RESULTS)
    args = p.parse_args(argv)
    for rate in (args.before, args.after):
        if not tp.RATE.fullmatch(rate):
            p.error(f"rate {rate!r}: write it as scripts/edge_cluster.sh takes it, e.g. 100mbit")
    if args.drop_at < WINDOW + 1 or args.steps < args.drop_at + AFTER + WINDOW:
        p.error(f"--drop-at must be > {WINDOW} and --steps >= --drop-at + {AFTER + WINDOW}")
    try:
        args.methods = [tp.parse_method(m) for m in args.methods]
    except tp.MatrixError as e:
        p.error(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    folder = args.results / f"{args.model}-{args.before}-{args.after}"
    folder.mkdir(parents=True, exist_ok=True)
    cluster, rows = Cluster(local=False), []
    try:
        for seed in args.seeds:
            for method in args.methods:
                with cluster.hold(args.before):
                    dropped = drop_run(method, args, folder, seed)
                records = tp.read_records(folder / f"{method.name}-seed{seed}.steps.jsonl")
                rows.append({"method": method.name, "seed": seed, **analyse(records, dropped)})
                r = rows[-1]
                print(f"linkdrop: {method.name} seed {seed}: {1e3 * r['before_s']:.1f} ms/step before, "
                      f"{1e3 * r['after_s']:.1f} ms {AFTER} steps after ({r['ratio']:.2f}x)", flush=True)
    finally:
        cluster.close()
    meta = {"model": args.model, "before": args.before, "after": args.after, "drop_at": args.drop_at,
            "steps": args.steps, "window": WINDOW, "after_centre": AFTER, "runs": rows}
    (folder / "summary.json").write_text(json.dumps(meta, indent=1) + "\n")
    title = f"# Link drop: {args.model}, {args.before} -> {args.after} after {args.drop_at} steps\n\n"
    (folder / "summary.md").write_text(title + table(rows) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
