"""Compress + decompress of a model's real gradients: GradPart against Top-k at the same density.

    python -m benchmarks.real_gradients resnet20                # the density ceiling at 2 %
    python -m benchmarks.real_gradients resnet20 --ceiling 0.002

One process, one TF thread, Horovod at size 1 (each method's own exchange included). The
gradients are those of four batches of 64 random images through a freshly built model. GradPart
(its fixed rule, ``follow_link=False``, with the given density ceiling) settles for ``--calls``
calls on the sparsified gradients; exact Top-k then runs at GradPart's mean density per tensor
over those calls, and the two are timed interleaved, call by call, over the same gradients.
Prints medians and minima of a call that compresses and decompresses every sparsified gradient.
"""
import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("HOROVOD_CYCLE_TIME", "0.1")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness.models import MODELS, SHAPES, build_model  # noqa: E402
from hvd_gradpart import get_compressor, metrics  # noqa: E402


def gradients(name, batches=4):
    """The sparsifiable gradients (1024 elements or more) of ``batches`` random batches."""
    model, rs = build_model(name, SHAPES[name], 10), np.random.RandomState(0)
    out = []
    for _ in range(batches):
        x = tf.constant(rs.rand(64, *SHAPES[name]).astype(np.float32))
        y = tf.constant(rs.randint(0, 10, 64))
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
        out.append([g for g in tape.gradient(loss, model.trainable_variables) if g.shape.num_elements() >= 1024])
    return out


def exchange(compressors):
    """One call: every gradient through its compressor's compress and decompress."""
    return tf.function(lambda grads: [tf.reshape(c.decompress(*c.compress(g)), [-1])[:1]
                                      for c, g in zip(compressors, grads)])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", choices=MODELS)
    p.add_argument("--ceiling", type=float, default=0.02, help="GradPart's density_ceiling")
    p.add_argument("--calls", type=int, default=40)
    args = p.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    hvd.init()
    grads = gradients(args.model)
    gradpart = get_compressor("gradpart", follow_link=False, density_ceiling=args.ceiling)
    runs = {"gradpart": exchange([gradpart] * len(grads[0]))}
    for i in range(args.calls):
        [out.numpy() for out in runs["gradpart"](grads[i % len(grads)])]
    # slot "f/k" is the k-th compress call of the traced function: the k-th gradient
    rows = sorted(metrics.snapshot(gradpart).items(), key=lambda item: int(item[0].rsplit("/", 1)[1]))
    densities = [max(row["total_sent_elements"] / (row["steps"] * row["elements"]), 1e-6) for _, row in rows]
    runs["topk"] = exchange([get_compressor("topk", ratio=d) for d in densities])
    spent = {name: [] for name in runs}
    for i in range(args.calls + 8):
        for name, run in runs.items():
            start = time.perf_counter()
            [out.numpy() for out in run(grads[i % len(grads)])]
            if i >= 8:
                spent[name].append(1e3 * (time.perf_counter() - start))
    print(f"{args.model}: {len(grads[0])} gradients, GradPart's mean density {np.mean(densities):.4%}, "
          f"ceiling {args.ceiling:g}")
    for name, times in spent.items():
        print(f"  {name:9s} {statistics.median(times):6.2f} ms (min {min(times):.2f})")
    print(f"  gradpart / topk {statistics.median(spent['gradpart']) / statistics.median(spent['topk']):.2f}")


if __name__ == "__main__":
    main()
