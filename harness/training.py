"""The data-parallel training loop shared by scripts/train.py and the benchmarks.

Every distributed line is marked ``# Horovod:``.
"""
import glob
import os
import statistics
import time

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from hvd_gradpart import metrics

LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def limit_threads(threads):
    """One intra- and inter-op pool of ``threads`` (ranks sharing cores)."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)


def link_counters():
    """Bytes sent and received on this host's non-loopback interfaces."""
    tx = rx = 0
    for stats in glob.glob("/sys/class/net/*/statistics"):
        if os.path.basename(os.path.dirname(stats)) == "lo":
            continue
        with open(f"{stats}/tx_bytes") as f:
            tx += int(f.read())
        with open(f"{stats}/rx_bytes") as f:
            rx += int(f.read())
    return {"tx_bytes": tx, "rx_bytes": rx}


def make_step(model, optimizer, compression, communicate=True, num_groups=0):
    """A compiled training step; ``communicate=False`` gives the compute-only bound.

    ``num_groups`` goes to ``DistributedGradientTape`` (as ``groups=``, its
    current name): 0 reduces each gradient on its own, ``g > 0`` in ``g``
    groups. A sparse compressor sends each group in one collective, so
    ``num_groups=1`` is its fast path.
    """
    if not isinstance(num_groups, int) or num_groups < 0:
        raise ValueError(f"num_groups must be an int >= 0 (0: no groups), got {num_groups!r}")

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            logits = model(x, training=True)
            loss = LOSS(y, logits)
        if communicate:
            # Horovod: wrap the tape; gradients are exchanged with the chosen compression.
            tape = hvd.DistributedGradientTape(tape, compression=compression, groups=num_groups or None)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        hits = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y), tf.float32))
        return loss, hits

    return step


def broadcast_initial_state(model, optimizer):
    # Horovod: every rank starts from rank 0's weights and optimizer state.
    hvd.broadcast_variables(model.variables, root_rank=0)
    hvd.broadcast_variables(optimizer.variables(), root_rank=0)


def recalibrate_batchnorm(model, x, batch_size=64, batches=20):
    """Sets every BatchNormalization layer's moving statistics to the plain
    mean of its batch statistics over the first ``batches`` batches of ``x``.

    Keras's moving averages (momentum 0.99) trail the weights by about a
    hundred steps. A sparse exchange moves weights in bursts, so after a short
    run they describe old weights and inference collapses although the
    weights are good (docs/results.md). Training is unaffected: it uses batch
    statistics. Returns the number of layers recalibrated.
    """
    layers = [layer for layer in model.submodules if isinstance(layer, tf.keras.layers.BatchNormalization)]
    if not layers:
        return 0
    saved = [layer.momentum for layer in layers]
    try:
        for i in range(min(batches, -(-len(x) // batch_size))):
            for layer in layers:
                layer.momentum = 1.0 - 1.0 / (i + 1)  # running mean over the batches so far
            model(x[i * batch_size:(i + 1) * batch_size], training=True)
    finally:
        for layer, momentum in zip(layers, saved):
            layer.momentum = momentum
    return len(layers)


def evaluate(model, x, y, batch_size=500):
    """Test loss and accuracy over ``(x, y)``."""
    losses, hits = [], 0
    for i in range(0, len(x), batch_size):
        logits = model(x[i:i + batch_size], training=False)
        losses.append(float(LOSS(y[i:i + batch_size], logits)) * len(logits))
        hits += int(np.sum(np.argmax(logits, 1) == y[i:i + batch_size]))
    return sum(losses) / len(x), hits / len(x)


def compression_summary(compression):
    """The compressor's byte accounting, or None for Horovod's dense ones."""
    instance = metrics.resolve(compression)
    return metrics.summary(instance) if instance is not None else None


def time_steps(step, batch, steps, warmup, windows):
    """Median seconds per step over ``windows`` windows of ``steps`` after warm-up."""
    for _ in range(warmup):
        step(*batch)[0].numpy()
    times = []
    for _ in range(windows):
        start = time.perf_counter()
        for _ in range(steps):
            out = step(*batch)
        out[0].numpy()
        times.append((time.perf_counter() - start) / steps)
    return statistics.median(times), times
