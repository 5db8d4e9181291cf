"""A user's Keras ``model.fit`` script under Horovod, with only ``compression=`` changed.

The usual shape of a Horovod Keras script: a small convolutional net with
Dropout, Adam (or ``--optimizer``; SGD with ``--momentum``) at a learning
rate scaled by the number of ranks, Horovod's callbacks (broadcast of rank
0's state, metric averaging, learning-rate warm-up) and ``ModelCheckpoint``
on rank 0 only. Each name in
``--compression`` trains a fresh model in turn, from the same seed; rank 0
prints one ``RESULT {json}`` line per name (test accuracy, ratio).

Usage: ``horovodrun -np 2 python keras_fit_client.py --compression none gradpart --workdir DIR``.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd
from common import assert_same_on_all_ranks, check
from harness import data
from hvd_gradpart import get_compressor, metrics, summary

OPTIMIZERS = {"adam": tf.keras.optimizers.Adam, "rmsprop": tf.keras.optimizers.RMSprop,
              "adagrad": tf.keras.optimizers.Adagrad, "sgd": tf.keras.optimizers.SGD}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--compression", nargs="+", default=["none", "gradpart"])
parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adam")
parser.add_argument("--lr", type=float, default=0.001, help="single-rank learning rate")
parser.add_argument("--momentum", type=float, default=0.0, help="SGD's momentum (--optimizer sgd only)")
parser.add_argument("--epochs", type=int, default=6)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--dataset", default="mnist5k")
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--workdir", default=".")
args = parser.parse_args()
if args.momentum and args.optimizer != "sgd":
    parser.error("--momentum is SGD's: pass --optimizer sgd")

# Horovod: initialize Horovod.
hvd.init()

dataset = data.load_dataset(args.dataset, seed=args.seed)
# Horovod: every rank trains on its own shard.
x_train, y_train = data.shard(dataset.x_train, dataset.y_train, hvd.rank(), hvd.size())
steps_per_epoch = len(x_train) // args.batch_size


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
    batches = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
               .shuffle(len(x_train), seed=args.seed + hvd.rank()).repeat().batch(args.batch_size))
    model = build_model()
    compression = get_compressor(name)  # its defaults, whatever the optimizer

    # Horovod: scale the learning rate by the number of workers.
    scaled_lr = args.lr * hvd.size()
    if args.momentum:  # Horovod's warm-up callback corrects the momentum: a legacy optimizer's variable
        opt = tf.keras.optimizers.legacy.SGD(scaled_lr, momentum=args.momentum)
    else:
        opt = OPTIMIZERS[args.optimizer](scaled_lr)

    # Horovod: add the Horovod distributed optimizer; only `compression` differs from stock usage.
    opt = hvd.DistributedOptimizer(opt, compression=compression)

    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                  metrics=["accuracy"])
    callbacks = [
        # Horovod: broadcast initial variable states from rank 0 to all other processes.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Horovod: average metrics among workers at the end of every epoch.
        hvd.callbacks.MetricAverageCallback(),
        # Horovod: ramp the learning rate up to scaled_lr over the first epoch.
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1, verbose=0),
    ]
    checkpoint = os.path.join(args.workdir, f"{name}-checkpoint-{{epoch}}.h5")
    # Horovod: save checkpoints only on worker 0 so other workers cannot corrupt them.
    if hvd.rank() == 0:
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(checkpoint))

    history = model.fit(batches, steps_per_epoch=steps_per_epoch, epochs=args.epochs,
                        callbacks=callbacks, verbose=0)
    assert_same_on_all_ranks(model.get_weights(), f"{name}: weights after fit")
    loss, accuracy = model.evaluate(dataset.x_test, dataset.y_test, batch_size=500, verbose=0)
    if hvd.rank() == 0:
        saved = tf.keras.models.load_model(checkpoint.format(epoch=args.epochs), compile=False)
        check(all(np.array_equal(a, b) for a, b in zip(saved.get_weights(), model.get_weights())),
              f"{name}: the last ModelCheckpoint does not hold the trained weights")
    sparse = metrics.resolve(compression)
    handed = bool(sparse) and any(slot.delivered is not None for slot in sparse.memory.slots.values())
    return {"compression": name, "optimizer": args.optimizer, "momentum": args.momentum, "seed": args.seed,
            "handed_over": handed,  # GradPart read the optimizer's momentum (hvd_gradpart.momentum)
            "test_accuracy": float(accuracy), "test_loss": float(loss),
            "train_loss": float(history.history["loss"][-1]),
            "ratio": summary(sparse)["compression_ratio"] if sparse else 1.0}


for name in args.compression:
    result = train(name)
    if hvd.rank() == 0:
        print("RESULT " + json.dumps(result), flush=True)
