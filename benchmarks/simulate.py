"""Data-parallel training of W workers simulated exactly in one process, for method studies.

    python -m benchmarks.simulate MODEL [--epochs 3] [--seeds 0,1,2] [--workers 2]
        [--optimizer sgd|adam] [--out FILE.jsonl] [--trace FILE.jsonl --trace-steps 50]
        [--diagnose FILE.jsonl [--diagnose-every 1]] RUN...
    python -m benchmarks.simulate --summarize FILE.jsonl
    python -m benchmarks.simulate --summarize-trace TRACE.jsonl

RUN is a method, ``NAME=COMPRESSOR[,KEY=VALUE...]`` (``harness/methods.py``: ``gradpart``,
``no-partition=gradpart,partition=false``); COMPRESSOR is a registry name or ``module:Class``
(a subclass under study). Every run trains on mnist5k
with what ``scripts/train.py`` uses: the dataset and model seeded by the seed, shard
``x[w::W]`` per worker, batch 32 per worker in the order ``data.batches`` gives, SGD with
momentum 0.9 (0 for a compressor with its own, as dgc) at 0.01 x W (``--optimizer adam``:
Keras Adam at 1e-3 instead), BatchNorm recalibrated on 20 training batches before
each evaluation. Test accuracy is evaluated every quarter epoch (not timed), with the
realized density (elements sent / elements handled, sparsified tensors) and compression
ratio (dense bytes / bytes sent, as the compressor counts them) over the quarter and over
the run so far; one JSON record per evaluation goes to ``--out``.

Why it is faithful: on W ranks each rank computes its shard's gradient, its own compressor
instance (its own residuals and predictions) selects, every selection is allgathered and
each rank decodes the same sum scaled by ``marker / W``, the marker being Horovod's
allreduce (Average) of ones, i.e. 1. Here worker w has its own compressor instance, and
``compress``/``decompress`` are called directly after ``hvd.init()`` in one process, where
the allgather is the identity, so each instance's ``decompress`` returns that worker's own
selection times the marker it is handed over ``hvd.size() = 1``; handing it the average
of what every worker's ``compress`` returned, over ``W`` again (a marker of ``1 / W``, and
the means of the link budget's figures the first marker carries, which its ratio to the
marker gives back), gives the selection times ``1 / W``, and the sum over workers is what
every rank applies (a hand-over to the optimizer's momentum is linear, so it sums the same). Tensors the compressor leaves dense come back untouched and are averaged
directly, as Horovod's allreduce would. One optimizer applies the result: the ranks'
optimizers are bit-identical copies. A method whose ``compress`` sums over ranks itself
(``sums_in_compress``: PowerSGD, GradPart's spectral key area) cannot be simulated so and is
refused; ``benchmarks.tta --local`` runs it on two real ranks without a link. What is not
simulated: wall-clock time on a link
(``--out``'s ``train_s`` is this process's compute) and fp rounding order of a real
allreduce.

``--trace`` writes, for the first ``--trace-steps`` steps, worker 0's per-tensor state
each step: the predicted fit's entropy power ``exp(h)`` against the fresh gradient's own
fit, both thresholds, the key-area size and the elements sent.

``--diagnose`` writes one record per step (``benchmarks.diagnose``: the realized density,
worker 0's residual against its fresh gradient and the residual's age, the norms of the
averaged gradient and of the update the optimizer applied, the loss).
"""
import argparse
import collections
import json
import math
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import diagnose  # noqa: E402
from harness import methods, training  # noqa: E402
from harness.data import batches, load_dataset, shard  # noqa: E402
from harness.models import build_model  # noqa: E402
from hvd_gradpart import entropy, momentum, snapshot, stats  # noqa: E402
from hvd_gradpart.compressors.base import BaseCompressor  # noqa: E402

BATCH, LR, BN_BATCHES, EVALS_PER_EPOCH = 32, 0.01, 20, 4
ADAM_LR = 1e-3
OPTIMIZERS = ("sgd", "adam")


def make_optimizer(kind, compressors, workers):
    """``sgd``: SGD at ``LR`` x ``workers``, momentum 0.9 (0 when the compressor has a momentum
    of its own, as DGC's correction); ``adam``: Keras Adam at ``ADAM_LR``, its defaults else."""
    if kind == "adam":
        return tf.keras.optimizers.Adam(ADAM_LR)
    if kind != "sgd":
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {kind!r}")
    own = compressors and getattr(compressors[0], "momentum", 0)
    return tf.keras.optimizers.SGD(LR * workers, momentum=0.0 if own else 0.9)


def make_step(model, optimizer, compressors, workers):
    """One compiled step of ``workers`` simulated ranks; returns (mean loss, worker 0's gradients,
    the global norm of the averaged gradient handed to the optimizer)."""
    sparse = compressors and isinstance(compressors[0], BaseCompressor)
    weights = model.trainable_variables

    @tf.function
    def step(xs, ys):
        losses, grads = [], []
        for w in range(workers):
            with tf.GradientTape() as tape:
                loss = training.LOSS(ys[w], model(xs[w], training=True))
            losses.append(loss)
            grads.append(tape.gradient(loss, weights))
        if sparse:
            queued = [[c.compress(g) for g in gs] for c, gs in zip(compressors, grads)]
            averaged = []
            for j, g in enumerate(grads[0]):
                if queued[0][j][1] is None:  # left dense: Horovod's allreduce averages it
                    averaged.append(tf.add_n([gs[j] for gs in grads]) / workers)
                else:  # Horovod's Average of what compress returned, over W again (hvd.size() = 1)
                    reduced = tf.add_n([q[j][0] for q in queued]) / workers ** 2
                    averaged.append(tf.add_n([c.decompress(reduced, q[j][1])
                                              for c, q in zip(compressors, queued)]))
        else:
            averaged = [tf.add_n(list(parts)) / workers for parts in zip(*grads)]
        optimizer.apply_gradients(zip(averaged, weights))
        return tf.add_n(losses) / workers, grads[0], tf.linalg.global_norm(averaged)

    return step


class Counter:
    """Elements and bytes every worker's compressor handled and sent, summed."""

    def __init__(self, compressors):
        self.compressors = [c for c in compressors if isinstance(c, BaseCompressor)]
        self.elements = self.sent = 0.0

    def after_step(self):
        for c in self.compressors:
            for v in snapshot(c).values():
                self.elements += v["elements"]
                self.sent += v["sent_elements"]

    def totals(self):
        """``(elements, sent elements, dense bytes, sent bytes)`` so far."""
        rows = [v for c in self.compressors for v in snapshot(c).values()]
        return (self.elements, self.sent, sum(r["total_dense_bytes"] for r in rows),
                sum(r["total_sent_bytes"] for r in rows))


def trace_rows(compressor, grads, step):
    """Worker 0's per-tensor state at ``step`` (predicted vs fresh fit, thresholds)."""
    rows = []
    sparse = [g for g in grads if compressor.sparsifies(g)]
    for (key, v), g in zip(snapshot(compressor).items(), sparse):
        sample = stats.strided_sample(tf.reshape(tf.cast(g, tf.float64), [-1]), 4096)
        fresh = stats.fit(sample, weights=tf.not_equal(sample, 0))
        predicted = stats.Fit(*(tf.constant(v[k], tf.float64) for k in ("mu", "alpha", "beta")),
                              tf.constant(0))
        rows.append({"step": step, "tensor": key, "elements": v["elements"],
                     "density": v["sent_elements"] / v["elements"], "key_size": v.get("key_size"),
                     "tau_key": v.get("tau_key"), "tau_sparse": v.get("tau_sparse"),
                     "power_pred": float(tf.exp(entropy.entropy(predicted))),
                     "power_fresh": float(tf.exp(entropy.entropy(fresh))),
                     "beta_pred": v["beta"], "beta_fresh": float(fresh.beta),
                     "std_fresh": float(tf.math.reduce_std(tf.cast(g, tf.float64))),
                     "abs_max_fresh": float(tf.reduce_max(tf.abs(g)))})
    return rows


def check_simulable(runs, model_name, workers):
    """Refuses (``SystemExit``, saying what to run instead) a run whose compressor sums over
    ranks inside ``compress``: one process cannot simulate its workers."""
    for name, compressor_name, options in runs:
        compressor = methods.build(compressor_name, options)
        if workers > 1 and getattr(compressor, "sums_in_compress", lambda: False)():
            raise SystemExit(f"simulate: {name} sums over ranks inside compress (PowerSGD's factors, GradPart's "
                             "spectral key area), which one process cannot simulate; run it on two real ranks "
                             f"without a link instead: python -m benchmarks.tta --local --models {model_name} "
                             "--methods ...")


def run_one(model_name, name, compressor_name, options, seed, epochs, workers, out, trace, trace_steps,
            optimizer="sgd", diagnose_to=None, diagnose_every=1):
    """Trains one run; writes one record per quarter epoch to ``out`` (and the trace, and with
    ``diagnose_to`` one record per ``diagnose_every`` steps, ``diagnose.Recorder``)."""
    data = load_dataset("mnist5k", seed=seed)
    tf.keras.utils.set_random_seed(seed)
    model = build_model(model_name, data.x_train.shape[1:], data.num_classes, seed=seed)
    compressors = [methods.build(compressor_name, options) for _ in range(workers)]
    kind, optimizer = optimizer, make_optimizer(optimizer, compressors, workers)
    for compressor in compressors:  # as scripts/train.py tells a compressor that reads it
        momentum.follow(compressor, optimizer)
    step = make_step(model, optimizer, compressors, workers)
    counter = Counter(compressors)
    shards = [shard(data.x_train, data.y_train, w, workers) for w in range(workers)]
    per_epoch = len(shards[0][0]) // BATCH
    recorder = diagnose_to and diagnose.Recorder(
        diagnose_to, model, compressors, {"model": model_name, "run": name, "optimizer": kind, "seed": seed},
        per_epoch, diagnose_every)
    evals = {round(per_epoch * q / EVALS_PER_EPOCH) for q in range(1, EVALS_PER_EPOCH + 1)}
    steps, train_s, last = 0, 0.0, (0.0, 0.0, 0.0, 0.0)
    for epoch in range(epochs):
        streams = [batches(x, y, BATCH, seed, epoch) for x, y in shards]
        for i, pairs in enumerate(zip(*streams), 1):
            if recorder:
                recorder.before()
            start = time.perf_counter()
            loss, grads, grad_norm = step(tf.stack([p[0] for p in pairs]), tf.stack([p[1] for p in pairs]))
            float(loss)
            train_s += time.perf_counter() - start
            counter.after_step()
            steps += 1
            if recorder:
                recorder.after(steps, float(loss), grads, float(grad_norm))
            if trace and steps <= trace_steps and counter.compressors:
                with open(trace, "a") as f:
                    for row in trace_rows(compressors[0], grads, steps):
                        f.write(json.dumps({"model": model_name, "run": name, "seed": seed, **row}) + "\n")
            if i not in evals:
                continue
            training.recalibrate_batchnorm(model, data.x_train, BATCH, BN_BATCHES)
            test_loss, test_acc = training.evaluate(model, data.x_test, data.y_test)
            now = counter.totals()
            delta = [a - b for a, b in zip(now, last)]
            last = now
            record = {"model": model_name, "run": name, "compressor": compressor_name, "options": options,
                      "optimizer": kind, "seed": seed, "workers": workers, "epoch": round(epoch + i / per_epoch, 3),
                      "step": steps, "test_acc": test_acc, "test_loss": test_loss, "train_s": train_s,
                      "density": _ratio(delta[1], delta[0]), "density_total": _ratio(now[1], now[0]),
                      "ratio": _ratio(delta[2], delta[3]), "ratio_total": _ratio(now[2], now[3])}
            print(f"{model_name} {name} seed {seed} epoch {record['epoch']:.2f} acc {test_acc:.4f} "
                  f"density {record['density'] or 1.0:.2e} ratio {record['ratio_total'] or 1.0:.0f}",
                  flush=True)
            if out:
                with open(out, "a") as f:
                    f.write(json.dumps(record, sort_keys=True) + "\n")


def _ratio(a, b):
    return a / b if b else None


def summarize(path):
    """Markdown table: per model and run, test accuracy mean +- half range over seeds at each
    evaluation, and the realized ratio and density over the whole run."""
    groups = collections.defaultdict(lambda: collections.defaultdict(list))
    for line in open(path):
        r = json.loads(line)
        groups[(r["model"], r["run"])][r["epoch"]].append(r)
    points = sorted({e for g in groups.values() for e in g})
    print("| model | run | seeds | " + " | ".join(f"ep {e:g}" for e in points) + " | ratio | density |")
    print("|---|---|---|" + "---|" * (len(points) + 2))
    for (model, run), by_epoch in sorted(groups.items()):
        cells = []
        for e in points:
            accs = [r["test_acc"] for r in by_epoch.get(e, [])]
            cells.append(f"{statistics.mean(accs):.3f}±{(max(accs) - min(accs)) / 2:.3f}" if accs else "–")
        final = by_epoch[max(by_epoch)]
        ratio = [r["ratio_total"] for r in final if r["ratio_total"]]
        density = [r["density_total"] for r in final if r["density_total"]]
        print(f"| {model} | {run} | {len(final)} | " + " | ".join(cells) +
              f" | {statistics.mean(ratio):.0f} | {statistics.mean(density):.2e} |" if ratio else
              f"| {model} | {run} | {len(final)} | " + " | ".join(cells) + " | 1 | – |")


def summarize_trace(path, steps=(1, 2, 5, 10, 15, 20, 25, 30, 40, 50)):
    """Markdown table of a ``--trace`` file: per tensor and chosen step, the density, the
    predicted over the fresh entropy power, the sparse threshold in fresh standard
    deviations, both thresholds' ratio and the key area's share."""
    print("| model | tensor | elements | step | density | exp(h) predicted / fresh | tau_sparse / fresh sd "
          "| tau_key / tau_sparse | key share |")
    print("|---|---|---|---|---|---|---|---|---|")
    for line in open(path):
        r = json.loads(line)
        if r["step"] in steps:
            print(f"| {r['model']} | {r['tensor'].split('/')[-1]} | {r['elements']:.0f} | {r['step']} "
                  f"| {r['density']:.1e} | {r['power_pred'] / r['power_fresh']:.2f} "
                  f"| {r['tau_sparse'] / r['std_fresh']:.1f} | {r['tau_key'] / r['tau_sparse']:.3f} "
                  f"| {r['key_size'] / r['elements']:.2f} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", nargs="?")
    p.add_argument("runs", nargs="*", type=methods.parse, help=methods.GRAMMAR)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", default="0,1,2", help="comma-separated")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                   help=f"sgd: momentum 0.9 at {LR} x workers; adam: Keras Adam at {ADAM_LR}")
    p.add_argument("--out", help="JSONL file to append one record per evaluation to")
    p.add_argument("--trace", help="JSONL file for worker 0's per-tensor state in the first steps")
    p.add_argument("--trace-steps", type=int, default=50)
    p.add_argument("--diagnose", metavar="FILE", help="JSONL file for one diagnostic record per step "
                   "(benchmarks.diagnose)")
    p.add_argument("--diagnose-every", type=int, default=1, help="record every this many steps")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--summarize", metavar="FILE", help="print the table of a --out file and exit")
    p.add_argument("--summarize-trace", metavar="FILE", help="print the table of a --trace file and exit")
    args = p.parse_args(argv)
    if args.summarize:
        return summarize(args.summarize)
    if args.summarize_trace:
        return summarize_trace(args.summarize_trace)
    if not args.model or not args.runs:
        p.error("give MODEL and at least one RUN (or --summarize FILE)")
    if args.workers < 1 or args.epochs < 1 or args.diagnose_every < 1:
        p.error("--workers, --epochs and --diagnose-every must be >= 1")
    training.limit_threads(args.threads)
    hvd.init()
    if hvd.size() != 1:
        p.error("run in one process (no horovodrun): the workers are simulated")
    check_simulable(args.runs, args.model, args.workers)
    for seed in (int(s) for s in args.seeds.split(",")):
        for name, compressor, options in args.runs:
            run_one(args.model, name, compressor, options, seed, args.epochs, args.workers,
                    args.out, args.trace, args.trace_steps, args.optimizer, args.diagnose, args.diagnose_every)


if __name__ == "__main__":
    main()
