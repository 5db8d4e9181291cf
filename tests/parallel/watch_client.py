"""Keras ``fit`` with ``CompressionLogger``: the figures reach rank 0's logs, and no other rank's.

A small MLP on a synthetic teacher's labels, two epochs per compressor (Top-k 1 % and
GradPart, each a fresh instance), with Horovod's usual callbacks and ``CompressionLogger``
after ``MetricAverageCallback``; rank 0 also writes ``TensorBoard`` events and prints its
progress lines (``verbose=2``). Every rank prints one ``RESULT {json}`` line per compressor:
its rank, its ``History``, its own compression ratio over the run (``summary``) and, on rank 0,
the TensorBoard tags written.

Usage: ``horovodrun -np 2 python watch_client.py --workdir DIR``.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd
from hvd_gradpart import CompressionLogger, GradPartCompressor, TopKCompressor, summary

FEATURES, HIDDEN, CLASSES, BATCH, STEPS = 64, 128, 10, 32, 10

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--workdir", required=True)
args = parser.parse_args()

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)
# Horovod: initialize Horovod.
hvd.init()

rng = np.random.default_rng(hvd.rank())  # every rank its own shard of one teacher's labels
teacher = np.random.default_rng(0).normal(size=(FEATURES, CLASSES))
x = rng.normal(size=(BATCH * STEPS, FEATURES)).astype(np.float32)
y = np.argmax(x @ teacher, axis=1)


def tags(folder):
    """The scalar tags in the TensorBoard event files under ``folder``."""
    found = set()
    for root, _, files in os.walk(folder):
        for name in files:
            for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                found.update(value.tag for value in event.summary.value)
    return sorted(found)


def train(name, compression):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input([FEATURES]), tf.keras.layers.Dense(HIDDEN, activation="relu"),
                                 tf.keras.layers.Dense(CLASSES)])
    # Horovod: scale the learning rate by the number of workers; only `compression` differs from stock usage.
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.05 * hvd.size()), compression=compression)
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), optimizer=opt,
                  metrics=["accuracy"])
    board = os.path.join(args.workdir, name)
    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        # After the averaging (rank 1 has no figures to average), before what writes the logs.
        CompressionLogger(compression),
    ]
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.TensorBoard(board, write_graph=False, profile_batch=0))
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, callbacks=callbacks,
                        verbose=2 if hvd.rank() == 0 else 0)
    sizes = [int(np.prod(w.shape)) for w in model.trainable_weights]
    return {"compression": name, "rank": hvd.rank(), "history": history.history, "sizes": sizes,
            "run_ratio": summary(compression)["compression_ratio"], "tags": tags(board) if hvd.rank() == 0 else []}


for name, compression in (("topk", TopKCompressor(ratio=0.01)), ("gradpart", GradPartCompressor())):
    print("RESULT " + json.dumps(train(name, compression), default=float), flush=True)
