"""Runs the time-to-accuracy matrix on the two-node edge cluster, resuming where it stopped.

    python -m benchmarks.tta                                   # the whole matrix (make bench-full)
    python -m benchmarks.tta --models mlp lenet5 --links 100mbit 20mbit   # make bench's subset
    python -m benchmarks.tta --dry-run ...                     # the plan: done, to run, waiting
    python -m benchmarks.tta --local --results /tmp/tta --models mlp --methods topk --seeds 0 --budget 20

Models x links x methods x seeds; ``benchmarks/tta_plan.py`` says which, and each run's stop
rules. Each run is one ``scripts/train.py`` launch through ``scripts/launch.py -np 2 -hostfile
hostfiles/edge --gloo``, under the cluster lock (``CLUSTER_LOCK``, the ``flock`` file that
``benchmarks/suite.sh`` takes), held only while the run uses the cluster. Before each launch
``scripts/edge_cluster.sh up --rate LINK`` builds or repairs the cluster and shapes every node,
so a cluster that another user re-shaped or took down in between is back as the run needs it; at
the end the cluster goes down. Runs already done are skipped: stop the driver at any time (the run
it cuts short is rerun) and start it again with the same arguments. ``--local`` runs both ranks
on this machine, without cluster, lock or shaping, under the link label ``localhost``. Each
launch's output goes to a ``.log`` beside its records; the exit code is 1 when a launch failed.
"""
import argparse
import datetime
import signal
import sys
import time
from pathlib import Path

from benchmarks import tta_plan as tp
from benchmarks.cluster import HOSTS, Cluster, train_launch


def say(text):
    print(f"tta: {text}", flush=True)


def launch(run, stops, results, hosts):
    """One train.py launch into a partial file, renamed once it ended well; returns its exit code."""
    path = run.path(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    part, log = path.with_name(path.name + ".part"), path.with_suffix(".log")
    part.unlink(missing_ok=True)
    with train_launch(tp.train_args(run, stops, part, tp.steps_path(path)), hosts, log) as proc:
        code = proc.wait()
    if code == 0 and part.exists() and part.stat().st_size:
        part.rename(path)
        return 0
    return code or 1


def stops_for(run, index, results):
    """The run's stop options; None while no compression's run of its seed is not done."""
    if run.method.name == tp.REFERENCE:
        return tp.stop_options(run)
    ref = run.reference()
    if not tp.is_done(ref, index, results):
        return None
    return tp.stop_options(run, tp.read_records(ref.path(results)))


def show_plan(runs, results, lines=True):
    """One line per run (done, run: its stop options, wait: for no compression), then the counts."""
    index = tp.read_index(results)
    counts = {"done": 0, "run": 0, "wait": 0}
    for run in runs:
        stops = None
        if tp.is_done(run, index, results):
            state = "done"
        else:
            stops = stops_for(run, index, results)
            state = "wait" if stops is None else "run"
        counts[state] += 1
        if lines:
            spec = ",".join((run.method.compressor, *run.method.options))
            detail = {"done": str(run.path(results).relative_to(results)),
                      "run": " ".join(stops or ()),
                      "wait": f"for none: --max-steps {tp.STEP_FACTOR * run.budget}, --stop-at-acc 99 % of its "
                              f"final accuracy, --max-train-s {tp.TIME_FACTOR:g}x its clock (>= {tp.TIME_FLOOR_S:g} s)"}
            print(f"{state} {run.model} {run.link} seed{run.seed} {run.method.name} [{spec}] {detail[state]}")
    say(f"{len(runs)} runs: {counts['done']} done, {counts['run']} to run now, {counts['wait']} after "
        f"no compression's run of their seed; results in {results}")


def finished(run, results, launch_s):
    """One line on a run that ended well: why it stopped, where, after how long."""
    last = tp.read_records(run.path(results))[-1]
    return (f"done in {launch_s:.0f} s: stopped by {last.get('stopped') or 'its epochs'} at step {last['step']}, "
            f"test acc {last['test_acc']:.3f}, {last['train_s'] - last['first_step_s']:.1f} s after a "
            f"{last['first_step_s']:.1f} s first step")


def execute(runs, results, cluster, hosts):
    """Runs what is not done, in order; returns the number of failed launches."""
    results.mkdir(parents=True, exist_ok=True)
    failed = 0
    for i, run in enumerate(runs, 1):
        if tp.is_done(run, tp.read_index(results), results):
            continue
        with cluster.hold(run.link):
            index = tp.read_index(results)  # another driver may have run it while this one waited
            if tp.is_done(run, index, results):
                continue
            stops = stops_for(run, index, results)
            if stops is None:
                say(f"[{i}/{len(runs)}] skipped {run.method.name}: no compression's run of "
                    f"{run.model} {run.link} seed {run.seed} has not finished")
                continue
            say(f"[{i}/{len(runs)}] {run.model} {run.link} seed {run.seed} {run.method.name}: {' '.join(stops)}")
            started = time.monotonic()
            code = launch(run, stops, results, hosts)
        launch_s = round(time.monotonic() - started, 1)
        tp.append_index(results, {
            "model": run.model, "link": run.link, "method": run.method.name, "seed": run.seed,
            "compressor": run.method.compressor, "options": list(run.method.options), "stops": stops,
            "status": "done" if code == 0 else "failed", "exit": code, "launch_s": launch_s,
            "file": str(run.path(results).relative_to(results)),
            "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")})
        if code == 0:
            say(f"[{i}/{len(runs)}] {finished(run, results, launch_s)}")
        else:
            failed += 1
            say(f"[{i}/{len(runs)}] FAILED (exit {code}): see {run.path(results).with_suffix('.log')}")
    return failed


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(tp.MODELS), metavar="MODEL")
    p.add_argument("--links", nargs="+", metavar="RATE", help=f"link rates (default: {' '.join(tp.LINKS)})")
    p.add_argument("--methods", nargs="+", metavar="METHOD",
                   help="registered names, grid names (topk-0.1%%, ...) or NAME=COMPRESSOR[,KEY=VALUE...] "
                        "(default: every registered compressor and the Top-k grid); none always runs")
    p.add_argument("--seeds", nargs="+", type=int, default=list(tp.SEEDS), metavar="SEED")
    p.add_argument("--budget", type=int, metavar="STEPS",
                   help="no compression's steps for every model instead of its own (the others' limits "
                        "scale with it), for short trials")
    p.add_argument("--results", type=lambda s: Path(s).resolve(), default=tp.RESULTS)
    p.add_argument("--local", action="store_true",
                   help="both ranks on this machine, no cluster or lock; the link is labelled localhost")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit")
    args = p.parse_args(argv)
    if args.local and args.links:
        p.error("--local runs on no shaped link: drop --links")
    links = [tp.LOCAL] if args.local else args.links or list(tp.LINKS)
    try:
        methods = [tp.parse_method(m) for m in args.methods] if args.methods else tp.default_methods()
        args.runs = tp.plan(args.models, links, args.seeds, methods, args.budget)
    except tp.MatrixError as e:
        p.error(str(e))
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.dry_run:
        show_plan(args.runs, args.results)
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the launch ends, the cluster goes down
    cluster = Cluster(args.local)
    try:
        failed = execute(args.runs, args.results, cluster, HOSTS["local" if args.local else "edge"])
    finally:
        cluster.close()
    show_plan(args.runs, args.results, lines=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
