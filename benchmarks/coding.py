"""What coding a sent value's position costs: encode and decode, in nanoseconds per value.

    python -m benchmarks.coding --out results/coding.json

One process, one TF thread, no Horovod. For each count ``k`` of values sent from a 2**20-element
tensor (positions drawn uniformly, float16 values), ``formats.encode`` (pricing every format and
packing the chosen one) and ``formats.decode`` run in ``tf.function``s, and so do the position
codes alone (``formats._pack``/``_unpack``) at gap widths of 7, 11 and 16 bits; calls interleave,
medians over ``--calls``. Per value means the call's time over ``k``: at small ``k`` the fixed cost
of the call's kernels dominates.
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hvd_gradpart import formats  # noqa: E402

N = 1 << 20
WIDTHS = (7, 11, 16)


def calls(k, seed=0):
    """``{name: (function, args)}`` of the timed calls for ``k`` values."""
    rng = np.random.default_rng(seed)
    indices = tf.constant(np.sort(rng.choice(N, k, replace=False)).astype(np.int32))
    values = tf.constant(rng.normal(size=k).astype(np.float16))
    payload, _ = formats.encode(values, indices, N, 0, ascending=True)
    gaps = formats._gaps(indices)  # noqa: SLF001
    found = {"encode": (tf.function(lambda v, i: formats.encode(v, i, N, 0, ascending=True)[0]), (values, indices)),
             "decode": (tf.function(lambda p: formats.decode(p, N, tf.float16)[0]), (payload,))}
    for b in WIDTHS:
        width = tf.constant(b)
        found[f"pack{b}"] = (tf.function(lambda g, w=width: formats._pack(w, g)), (gaps,))  # noqa: SLF001
        found[f"unpack{b}"] = (tf.function(lambda p, w=width: formats._unpack(w, p)),  # noqa: SLF001
                               (formats._pack(width, gaps),))  # noqa: SLF001
    return found


def measure(k, repeats):
    """``{name: median ns per value}`` for ``k`` values."""
    timed = calls(k)
    spent = {name: [] for name in timed}
    for f, args in timed.values():
        f(*args)
    for _ in range(repeats):
        for name, (f, args) in timed.items():
            start = time.perf_counter()
            f(*args).numpy()
            spent[name].append(time.perf_counter() - start)
    return {name: 1e9 * statistics.median(s) / k for name, s in spent.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--counts", type=int, nargs="+", default=[2000, 20000, 100000])
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--out", help="JSON file for the rows")
    args = p.parse_args(argv)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rows = []
    for k in args.counts:
        rows.append({"k": k, "n": N, "ns_per_value": {name: round(ns, 1) for name, ns in measure(k, args.calls).items()}})
        print(json.dumps(rows[-1]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"calls": args.calls, "threads": 1, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
