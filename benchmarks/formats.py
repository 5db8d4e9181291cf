"""Bytes on the wire per sent value, in the format the exchange picks, on real kernels' selections.

    python -m benchmarks.formats --out results/formats.json

One process, no Horovod launch. Each model trains with plain SGD on ``mnist5k`` batches for
``--steps`` steps; beside it, for every density, each kernel keeps an error-feedback residual as
Top-k does (accumulate ``r + g``, send the ``k`` largest magnitudes, keep the rest), so the last
step's selection has the structure training gives it (whole rows and columns of a kernel grow
together). That selection is encoded with float16 values as the exchange encodes it; a row per
kernel and density gives the format chosen and the bytes one rank sends per sent value: the
payload (header, positions, values), its length in the group's block and the marker (a group's
4-byte tag, once per step, is left out). ``uniform`` gives the same for ``k`` positions drawn
uniformly, for comparison; ``rows`` the old fixed format (int32 index + value, and a header row).
"""
import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness.data import load_dataset  # noqa: E402
from harness.models import build_model  # noqa: E402
from hvd_gradpart import exchange, formats  # noqa: E402

MODELS = ("mlp", "lenet5")
MIN_ELEMENTS = 1024  # the compressors' default: smaller tensors are sent whole
DENSITIES = (0.003, 0.01, 0.03)


def per_value(indices, values, n):
    """``(format name, bytes per sent value)`` of one rank's payload for this selection."""
    encoded = exchange.encode(tf.constant(values), tf.constant(indices, tf.int32), n, "fp16")
    return formats.name(int(encoded.format)), int(exchange.sent_bytes(encoded.payload)) / len(indices)


def run(model_name, steps, batch, seed):
    """Rows for the kernels of ``model_name`` that are sparsified, at every density."""
    tf.keras.utils.set_random_seed(seed)
    data = load_dataset("mnist5k", seed=seed)
    model = build_model(model_name, data.x_train.shape[1:], 10)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = tf.keras.optimizers.SGD(0.05)
    wanted = [i for i, v in enumerate(model.trainable_variables)
              if v.shape.rank >= 2 and v.shape.num_elements() >= MIN_ELEMENTS]
    residuals = {(i, d): np.zeros(model.trainable_variables[i].shape.num_elements(), np.float32)
                 for i in wanted for d in DENSITIES}
    selected = {}
    rs = np.random.RandomState(seed)

    @tf.function
    def grads(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        g = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(g, model.trainable_variables))
        return g

    for _ in range(steps):
        at = rs.choice(len(data.x_train), batch, replace=False)
        g = grads(data.x_train[at], data.y_train[at])
        for (i, d), r in residuals.items():
            acc = r + g[i].numpy().reshape(-1)
            k = max(1, int(round(d * acc.size)))
            top = np.sort(np.argpartition(-np.abs(acc), k - 1)[:k])
            selected[(i, d)] = (top, acc[top].copy())
            acc[top] = 0.0
            residuals[(i, d)] = acc
    rows = []
    for (i, d), (top, values) in sorted(selected.items()):
        n = residuals[(i, d)].size
        form, bpv = per_value(top, values, n)
        uniform = np.sort(rs.choice(n, len(top), replace=False))
        uform, ubpv = per_value(uniform, values, n)
        kernel = "x".join(map(str, model.trainable_variables[i].shape))
        rows.append({"model": model_name, "kernel": kernel, "elements": n, "density": d, "k": len(top),
                     "format": form, "bytes_per_value": bpv, "uniform_format": uform,
                     "uniform_bytes_per_value": ubpv, "rows_bytes_per_value": ((len(top) + 1) * 6 + 8) / len(top)})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="results/formats.json")
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rows = [row for m in args.models for row in run(m, args.steps, args.batch_size, args.seed)]
    for r in rows:
        print(f"{r['model']:7s} {r['kernel']:18s} {r['elements']:8d} {100 * r['density']:4.1f} %  k={r['k']:6d}  "
              f"{r['format']:7s} {r['bytes_per_value']:.3f} B/value  (uniform: {r['uniform_format']} "
              f"{r['uniform_bytes_per_value']:.3f}; int32 rows: {r['rows_bytes_per_value']:.3f})", flush=True)
    with open(args.out, "w") as f:
        json.dump({"steps": args.steps, "batch_size": args.batch_size, "seed": args.seed, "value_encoding": "fp16",
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
