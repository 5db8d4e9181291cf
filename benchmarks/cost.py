"""Compress + decompress cost of every sparse method, as a multiple of one memory pass.

    python -m benchmarks.cost --out results/cost.json
    python -m benchmarks.cost --group 40 --sizes 2304 9216 36864 --out results/cost-group.json

The reference is one elementwise pass that reads the gradient and the residual and writes the
residual (``residual.assign_add(grad)`` in a ``tf.function``), the least an error-feedback step
must do. One process, one TF thread; Horovod runs at size 1 and the sparse methods' own
exchange (one-rank allgather, decode into the dense result) is timed with them. Gradients are
Laplace draws, a fresh one each call (cycled from a precomputed set so that drawing them costs
nothing inside the timing). For each size every method and the reference run interleaved, call
by call, so that load from other processes falls on all of them alike; figures are medians.

Methods run at their defaults except: GradPart without following the link (one process has
no link; its budget would find the dense exchange cheaper and time no sparse step), exact Top-k
at GradPart's mean density over its last settling call on each gradient, after as many calls as
are timed (the comparison at equal bytes; error feedback makes the first calls sparser), DGC
without its warm-up (the density it trains at). The density shown is each method's last timed
call's: the exchange's share of the cost (indices, payload, decoding) grows with it. A one-rank
allgather still waits for Horovod's background cycle: the run uses a 0.1 ms cycle unless
``HOROVOD_CYCLE_TIME`` is set, and reports the time of a bare allgather of one header row, the
part of each figure that is that wait.

With ``--group T`` each call compresses ``T`` gradients of the size, then decompresses them, as
Horovod's grouped path (``groups=1``) does, so they share one exchange; every figure is then per
gradient (the call's time over ``T``), against ``T`` reference passes in one function.
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HOROVOD_CYCLE_TIME", "0.1")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hvd_gradpart import get_compressor, summary  # noqa: E402

WARMUP_CALLS = 8


def reference_pass(n, group=1):
    """``residual.assign_add(grad)`` on ``group`` ``n``-element float32 residuals, in a ``tf.function``."""
    residuals = [tf.Variable(tf.zeros([n]), trainable=False) for _ in range(group)]

    @tf.function
    def run(grads):
        for residual, grad in zip(residuals, grads):
            residual.assign_add(grad, read_value=False)
        return tf.zeros([1])

    return run


def bare_allgather():
    """One header-sized allgather: the exchange's fixed wait at size 1."""
    return tf.function(lambda grad: hvd.allgather(tf.zeros([1, 6], tf.uint8)))


def step(compressor):
    """Compress of every gradient of a group, then decompress of each, in a ``tf.function`` that
    returns one element of the dense results (as the reference returns one), so no copy out is
    timed."""
    def run(grads):
        compressed = [compressor.compress(grad) for grad in grads]
        return tf.concat([tf.reshape(compressor.decompress(*c), [-1])[:1] for c in compressed], 0)

    return tf.function(run)


def median_ms(runs, grads, calls):
    """``{name: median ms per call}``, the runs' calls interleaved."""
    for run in runs.values():
        for i in range(WARMUP_CALLS):
            run(grads[i % len(grads)]).numpy()
    spent = {name: [] for name in runs}
    for i in range(calls):
        for name, run in runs.items():
            start = time.perf_counter()
            run(grads[i % len(grads)]).numpy()
            spent[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(times) for name, times in spent.items()}


def measure(n, calls, group=1):
    """One size's row: the reference pass, the bare allgather and every method, per gradient of a
    group of ``group``."""
    rs = np.random.RandomState(n)
    grads = [[tf.constant(rs.laplace(0, 1e-3, n).astype(np.float32)) for _ in range(group)] for _ in range(4)]
    gradpart = get_compressor("gradpart", follow_link=False)
    settle = step(gradpart)
    for i in range(calls):
        if i == calls - len(grads):  # the last call on each gradient: the density Top-k gets
            before = summary(gradpart)["total_sent_elements"]
        settle(grads[i % len(grads)]).numpy()
    density = (summary(gradpart)["total_sent_elements"] - before) / (len(grads) * n * group)
    compressors = {"gradpart": gradpart, "topk": get_compressor("topk", ratio=density),
                   "dgc": get_compressor("dgc", warmup_steps=0), "sidco": get_compressor("sidco"),
                   "variance": get_compressor("variance")}
    runs = {"reference": reference_pass(n, group), "allgather": bare_allgather(),
            **{name: step(c) for name, c in compressors.items()}}
    ms = {name: t / group for name, t in median_ms(runs, grads, calls).items()}
    methods = {name: {"ms": ms[name], "x_reference": ms[name] / ms["reference"],
                      "density": summary(c)["last_density"]} for name, c in compressors.items()}
    return {"elements": n, "group": group, "reference_ms": ms["reference"], "allgather_ms": ms["allgather"],
            "methods": methods}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 1 << 22])
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--group", type=int, default=1, help="gradients compressed together (figures per gradient)")
    p.add_argument("--out", default="results/cost.json")
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    rows = []
    for n in args.sizes:
        row = measure(n, args.calls, args.group)
        rows.append(row)
        print(f"n={n}: reference pass {row['reference_ms']:.2f} ms, one-rank allgather {row['allgather_ms']:.2f} ms",
              flush=True)
        for name, m in row["methods"].items():
            print(f"  {name:9s} {m['ms']:7.2f} ms  {m['x_reference']:5.2f}x  density {m['density']:.5f}", flush=True)
    with open(args.out, "w") as f:
        json.dump({"threads": 1, "calls": args.calls, "horovod_cycle_time_ms": float(os.environ["HOROVOD_CYCLE_TIME"]),
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
