"""A user's custom training loop under Horovod, with only ``compression=`` changed.

The usual shape of a Horovod TF2 loop: a ``tf.function`` step wrapping its
tape in ``DistributedGradientTape``, traced twice through a Python
``first_batch`` flag (the first trace also broadcasts rank 0's model and
optimizer state), Adam at a learning rate scaled by the number of ranks, and
a ``tf.train.Checkpoint`` of model and optimizer written by rank 0 at the
end. Each name in ``--compression`` trains a fresh model in turn, from the
same seed; rank 0 prints one ``RESULT {json}`` line per name.

Usage: ``horovodrun -np 2 python tape_step_client.py --compression none gradpart --workdir DIR``.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

import horovod.tensorflow as hvd
from common import assert_same_on_all_ranks, check
from harness import data
from hvd_gradpart import get_compressor, metrics, summary

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", nargs="+", default=["none", "gradpart"])
parser.add_argument("--lr", type=float, default=0.001, help="single-rank learning rate")
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--dataset", default="mnist5k")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--workdir", default=".")
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

dataset = data.load_dataset(args.dataset, seed=args.seed)
# Horovod: every rank trains on its own shard.
x_train, y_train = data.shard(dataset.x_train, dataset.y_train, hvd.rank(), hvd.size())
steps = args.epochs * (len(x_train) // args.batch_size)


def build_model():
    return tf.keras.Sequential([
        tf.keras.Input(dataset.x_train.shape[1:]),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Conv2D(16, 3, activation="relu"),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Dropout(0.25),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.5),
        tf.keras.layers.Dense(dataset.num_classes, activation="softmax"),
    ])


def train(name):
    tf.keras.utils.set_random_seed(args.seed)
    images = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
              .shuffle(len(x_train), seed=args.seed + hvd.rank()).repeat().batch(args.batch_size))
    model = build_model()
    loss = tf.keras.losses.SparseCategoricalCrossentropy()
    # GradPart paces its deliveries for an adaptive optimizer (docs/algorithm.md, Pacing).
    compression = get_compressor(name)

    # Horovod: scale the learning rate by the number of workers.
    opt = tf.keras.optimizers.Adam(args.lr * hvd.size())
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)

    @tf.function
    def training_step(x, y, first_batch):
        with tf.GradientTape() as tape:
            loss_value = loss(y, model(x, training=True))

        # Horovod: wrap the tape; only `compression` differs from stock usage.
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        grads = tape.gradient(loss_value, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))

        # Horovod: broadcast initial variable states from rank 0 to all other processes,
        # after the first gradient step so that the optimizer's slots exist.
        if first_batch:
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(opt.variables, root_rank=0)
        return loss_value

    for batch, (x, y) in enumerate(images.take(steps)):
        loss_value = training_step(x, y, batch == 0)

    # Two signatures (first_batch True, False); the first call traces once more as it creates
    # the optimizer's variables.
    traces = training_step.experimental_get_tracing_count()
    check(traces >= 2, f"{name}: the step was traced {traces} times, expected a retrace")
    sparse = metrics.resolve(compression)
    if sparse:
        slots = len(sparse.memory.slots)
        sparsified = sum(v.shape.num_elements() >= sparse.min_elements for v in model.trainable_variables)
        check(slots == sparsified, f"{name}: {slots} residual slots after two traces, expected one per "
                                   f"sparsified gradient ({sparsified})")
    assert_same_on_all_ranks([v.numpy() for v in model.trainable_variables], f"{name}: weights")
    accuracy = float(np.mean(np.argmax(model.predict(dataset.x_test, batch_size=500, verbose=0), 1)
                             == dataset.y_test))

    # Every rank builds the model it restores into: Keras names layers by a per-process
    # counter, and Horovod matches collectives across ranks by names drawn from them.
    restored = build_model()
    # Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
    if hvd.rank() == 0:
        path = checkpoint.save(os.path.join(args.workdir, f"{name}-ckpt"))
        tf.train.Checkpoint(model=restored).restore(path).expect_partial()
        check(all(np.array_equal(a, b) for a, b in zip(restored.get_weights(), model.get_weights())),
              f"{name}: the checkpoint does not restore the trained weights")
    return {"compression": name, "optimizer": "adam", "seed": args.seed, "test_accuracy": accuracy,
            "train_loss": float(loss_value),
            "ratio": summary(sparse)["compression_ratio"] if sparse else 1.0}


for name in args.compression:
    result = train(name)
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
