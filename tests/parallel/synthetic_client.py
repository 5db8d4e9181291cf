"""A user's synthetic throughput benchmark under Horovod, with only the compression changed.

The usual shape of Horovod's TF2 synthetic benchmark: a ``tf.keras.applications``
model with random weights, one fixed random batch, a ``tf.function`` step traced
twice (``first_batch``) that builds its compression object inside itself,
warm-up batches, then images/s over timed iterations.
The default model, MobileNet (width 0.25) at 32x32, has what a sparse exchange must
cope with: 83 gradients (19 large enough to sparsify, 7 of them depthwise kernels)
and BatchNorm. Checks: ranks end
with bit-identical trainable weights, and the sparse compressor handled every gradient
of ``min_elements`` or more at a ratio above 1. Rank 0 prints ``RESULT {json}``.

Usage: ``horovodrun -np 2 python synthetic_client.py --compression gradpart``.
"""
import argparse
import json
import timeit

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd
from common import assert_same_on_all_ranks, check
from hvd_gradpart import COMPRESSORS, metrics, summary

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", default="gradpart")
parser.add_argument("--model", default="MobileNet", help="a tf.keras.applications model")
parser.add_argument("--alpha", type=float, default=0.25, help="width multiplier of the MobileNets")
parser.add_argument("--image-size", type=int, default=32)
parser.add_argument("--classes", type=int, default=10, help="1000 with --image-size 224: the stock model")
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=3)
parser.add_argument("--num-iters", type=int, default=2)
parser.add_argument("--groups", type=int, default=0, help="Horovod's groups (0: per tensor, as Horovod's benchmark)")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

width = {"alpha": args.alpha} if args.model.startswith("MobileNet") else {}
model = getattr(tf.keras.applications, args.model)(
    weights=None, input_shape=(args.image_size, args.image_size, 3), classes=args.classes, **width)
opt = tf.keras.optimizers.SGD(0.01)
images = tf.random.uniform([args.batch_size, args.image_size, args.image_size, 3], seed=hvd.rank())
labels = tf.random.uniform([args.batch_size, 1], minval=0, maxval=args.classes, dtype=tf.int64, seed=hvd.rank())


@tf.function
def benchmark_step(first_batch):
    # Horovod: the compression is chosen inside the traced step, as in Horovod's own benchmark,
    # and passed as a class (a sparse class runs on its one default instance: residuals persist).
    compression = COMPRESSORS[args.compression]
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(labels, probs))

    # Horovod: wrap the tape; only `compression` (and `groups` when asked) differs from stock usage.
    grouped = {"groups": args.groups} if args.groups else {}
    tape = hvd.DistributedGradientTape(tape, compression=compression, **grouped)
    gradients = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(gradients, model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables, root_rank=0)


trace_s = timeit.timeit(lambda: benchmark_step(first_batch=True), number=1)
trace_s += timeit.timeit(lambda: benchmark_step(first_batch=False), number=1)
timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_warmup_batches)
img_secs = []
for _ in range(args.num_iters):
    seconds = timeit.timeit(lambda: benchmark_step(first_batch=False), number=args.num_batches_per_iter)
    img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)

# BatchNorm's moving statistics stay rank-local, as under Horovod without compression.
assert_same_on_all_ranks([v.numpy() for v in model.trainable_variables], "weights")
result = {"compression": args.compression, "groups": args.groups, "model": args.model,
          "gradients": len(model.trainable_variables), "first_two_steps_s": trace_s,
          "img_sec_per_rank": float(np.mean(img_secs)), "ratio": 1.0}
sparse = metrics.resolve(COMPRESSORS[args.compression])
if sparse:
    totals = summary(sparse)
    expected = sum(v.shape.num_elements() >= sparse.min_elements for v in model.trainable_variables)
    check(totals["tensors"] == expected,
          f"{totals['tensors']} gradients went through the sparse exchange, expected {expected}")
    check(totals["compression_ratio"] > 1.0, f"compression ratio {totals['compression_ratio']:.2f}")
    result.update(sparsified=totals["tensors"], ratio=totals["compression_ratio"])
if hvd.rank() == 0:
    print("RESULT " + json.dumps(result), flush=True)
