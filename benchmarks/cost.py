"""Compress + decompress cost per step: GradPart against exact Top-k at the same density.

    python -m benchmarks.cost --out benchmarks/results/cost.json

One process, one TF thread, the two methods' calls interleaved; gradients are Laplace draws, a fresh one each call (cycled from a
precomputed set so that drawing them costs nothing inside the timing).
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

from hvd_gradpart import GradPartCompressor, TopKCompressor, summary  # noqa: E402


def per_call_ms(compressors, grads, calls):
    """Median ms per compress + decompress of each compressor, calls interleaved so that
    load from other processes falls on all of them alike."""
    runs = [tf.function(lambda g, c=c: c.decompress(*c.compress(g))) for c in compressors]
    for run in runs:
        for g in grads:
            run(g).numpy()
    times = [[] for _ in runs]
    for i in range(calls):
        for run, spent in zip(runs, times):
            start = time.perf_counter()
            run(grads[i % len(grads)]).numpy()
            spent.append(time.perf_counter() - start)
    return [1e3 * statistics.median(spent) for spent in times]


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[1 << 20, 1 << 22])
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--out", default="benchmarks/results/cost.json")
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    rows = []
    for n in args.sizes:
        rs = np.random.RandomState(n)
        grads = [tf.constant(rs.laplace(0, 1e-3, n).astype(np.float32)) for _ in range(4)]
        gradpart = GradPartCompressor()
        per_call_ms([gradpart], grads, args.calls)  # settles the density
        density = summary(gradpart)["last_density"]
        gp_ms, topk_ms = per_call_ms([gradpart, TopKCompressor(ratio=density)], grads, args.calls)
        rows.append({"elements": n, "gradpart_density": density, "gradpart_ms": gp_ms, "topk_ms": topk_ms})
        print(f"n={n}: gradpart {gp_ms:.2f} ms at density {density:.5f}; top-k {topk_ms:.2f} ms", flush=True)
    with open(args.out, "w") as f:
        json.dump({"threads": 1, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
