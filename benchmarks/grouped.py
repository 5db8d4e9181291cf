"""The grouped exchange against Horovod's per-tensor path: collectives per step and step time.

    horovodrun -np 2 -H localhost:2 python -m benchmarks.grouped \
        --models mlp lenet5 resnet20 --out results/grouped.jsonl

For each model (batch 64 per rank of synthetic data shaped as MNIST, or as CIFAR-10 for the
ResNets; one TF thread pair per rank) and each of GradPart, Top-k (1 %) and no compression
(``--methods``, names or ``NAME=COMPRESSOR[,KEY=VALUE...]``), builds ``training.make_step``
with each ``--groups`` count (default 0, every gradient on its own, and 1, one group; with
``k > 1`` Horovod splits the gradients, in variable order, into ``k`` groups, so a group whose
gradients are ready can be exchanged while the backward pass goes on), plus the compute-only
step. Each case first runs ``--timeline-steps`` steps under Horovod's timeline
(``benchmarks.timeline`` counts the collectives and times them); ``--matched-topk`` then adds,
per selection rule, exact Top-k at the density that rule sent in its last step
(``topk@NAME``). Every case is then timed in round-robin windows of ``--steps`` steps, so that
all see the same machine load. Rank 0 writes one JSON row per case and a Markdown table beside it.
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import timeline  # noqa: E402
from benchmarks.matched import SELECTION_RULES, matched_topk  # noqa: E402
from harness import methods, training  # noqa: E402
from harness.models import MODELS, SHAPES, build_model  # noqa: E402
from hvd_gradpart.metrics import resolve, summary  # noqa: E402

METHODS = [("gradpart", "gradpart", {}), ("topk", "topk", {"ratio": 0.01}), ("none", "none", {})]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=["mlp", "lenet5"])
    p.add_argument("--steps", type=int, default=20, help="steps per timing window")
    p.add_argument("--windows", type=int, default=5, help="timing windows per case")
    p.add_argument("--timeline-steps", type=int, default=5, help="steps recorded in the timeline")
    p.add_argument("--methods", nargs="+", type=methods.registered, default=METHODS,
                   help=f"NAME or {methods.GRAMMAR} (default: gradpart, topk at 1 %%, none)")
    p.add_argument("--matched-topk", action="store_true",
                   help="add Top-k at each selection rule's density (see the module doc)")
    p.add_argument("--groups", type=int, nargs="+", default=[0, 1],
                   help="num_groups values to measure (0: per tensor)")
    p.add_argument("--out", default="results/grouped.jsonl")
    return p.parse_args()


def case(name, shape, spec, groups):
    """``(step, compression)`` of one method (``harness.methods``; None: compute-only) at one
    group count."""
    compression = None if spec is None else methods.build(spec[1], spec[2])
    step = training.make_step(build_model(name, shape, 10), tf.keras.optimizers.SGD(0.01), compression,
                              communicate=compression is not None, num_groups=groups)
    return step, compression


def density(compression):
    """The density a compressor sent in its last step; None for a dense one."""
    instance = resolve(compression)
    return summary(instance)["last_density"] if instance is not None else None


def recorded(step, batch, steps, path):
    """Collectives per step of ``steps`` steps under the timeline, and the cycles per step that
    ran one (rank 0 writes the file; elsewhere ``({}, None)``)."""
    hvd.start_timeline(path, mark_cycles=True)
    training.time_steps(step, batch, steps, warmup=0, windows=1)
    hvd.stop_timeline()
    if hvd.rank() != 0:
        return {}, None
    events = settled(path)
    os.remove(path)
    found = timeline.collectives(events)
    return timeline.per_step(found, steps), timeline.rounds(events, found, steps)


def settled(path, wait_s=20.0):
    """The timeline's events once Horovod's writer thread has flushed them (the file parses and
    stops growing)."""
    last = None
    for _ in range(int(wait_s / 0.25)):
        time.sleep(0.25)
        size = os.path.getsize(path) if os.path.exists(path) else 0
        if size and size == last:
            try:
                return timeline.load(path)
            except ValueError:
                pass
        last = size
    raise RuntimeError(f"Horovod's timeline {path} was not written within {wait_s:.0f} s")


def markdown(rows):
    """The table of ``rows``: step time against compute-only, and the collectives of a step."""
    lines = ["| model | method | groups | density | ms/step (median, min) | over compute-only | collectives per step "
             "| cycles with a collective per step |", "|---|---|---|---|---|---|---|---|"]
    bound = {r["model"]: r["median_ms"] for r in rows if r["method"] == "compute-only"}
    for r in rows:
        ops = ", ".join(f"{c['per_step']:g} {op} ({c['tensors_each']:g} tensors, {c['median_ms']:.2f} ms)"
                        for op, c in r["collectives"].items()) or "-"
        over = r["median_ms"] / bound[r["model"]]
        density = f"{100 * r['density']:.2f} %" if r.get("density") is not None else "-"
        lines.append(f"| {r['model']} | {r['method']} | {r['num_groups'] or 'per tensor'} | {density} | "
                     f"{r['median_ms']:.1f}, {r['min_ms']:.1f} | {over:.2f}x | {ops} | {r.get('rounds') or '-'} |")
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    os.environ.setdefault("HOROVOD_TIMELINE", "DYNAMIC")  # hvd.start_timeline needs it at init
    hvd.init()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(hvd.rank())
    rows = []
    for name in args.models:
        shape = SHAPES[name]
        batch = (tf.constant(rng.random((64, *shape), dtype=np.float32)),
                 tf.constant(rng.integers(0, 10, 64).astype(np.int32)))
        todo = [("compute-only", 0, None)] + [(m[0], g, m) for m in args.methods for g in args.groups]
        steps, densities, found, rounds = {}, {}, {}, {}
        while todo:
            method, groups, spec = todo.pop(0)
            key = method, groups
            steps[key], compression = case(name, shape, spec, groups)
            training.time_steps(steps[key], batch, 5, warmup=5, windows=1)
            if spec is None:
                continue  # no collective, so Horovod writes no timeline
            found[key], rounds[key] = recorded(steps[key], batch, args.timeline_steps, f"{args.out}.timeline.json")
            hvd.join()  # rank 1 waits while rank 0 reads the timeline
            densities[key] = density(compression)
            if args.matched_topk and spec[1] in SELECTION_RULES:
                matched = matched_topk(method, densities[key])
                todo.insert(0, (matched[0], groups, matched))
        times = {key: [] for key in steps}
        for _ in range(args.windows):
            for key, step in steps.items():
                times[key].append(training.time_steps(step, batch, args.steps, warmup=0, windows=1)[0])
        for (method, groups), windows in times.items():
            rows.append({"model": name, "method": method, "num_groups": groups,
                         "median_ms": round(1e3 * statistics.median(windows), 2),
                         "min_ms": round(1e3 * min(windows), 2), "density": densities.get((method, groups)),
                         "collectives": found.get((method, groups), {}), "rounds": rounds.get((method, groups))})
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        with open(args.out.rsplit(".", 1)[0] + ".md", "w") as f:
            f.write(markdown(rows))
        print(markdown(rows))


if __name__ == "__main__":
    main()
