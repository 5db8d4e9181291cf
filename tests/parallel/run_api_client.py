"""A user's training launched from Python with ``horovod.run(fn, np=2)`` instead of horovodrun.

Run with the plain interpreter: ``horovod.run`` starts the ranks itself
(Gloo or MPI), runs ``train`` on each, and returns every rank's result. The
training is a Keras ``model.fit`` with Dropout and Adam on scikit-learn's
digits; only ``compression=`` differs between the names in ``--compression``.
Prints ``RESULT {json}`` per name once every rank returned the same weights.

Usage: ``python run_api_client.py --backend gloo --compression none gradpart``.
"""
import argparse
import hashlib
import json
import os
import sys

import horovod


def train(name, epochs, seed):
    """Runs on every rank; returns (rank, test accuracy, ratio, digest of the final weights)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf

    import horovod.tensorflow.keras as hvd
    from harness import data
    from hvd_gradpart import get_compressor, metrics, summary

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    # Horovod: initialize Horovod inside the function horovod.run runs on every rank.
    hvd.init()
    tf.keras.utils.set_random_seed(seed)
    dataset = data.load_dataset("digits", seed=seed)
    x, y = data.shard(dataset.x_train, dataset.y_train, hvd.rank(), hvd.size())
    model = tf.keras.Sequential([
        tf.keras.Input(dataset.x_train.shape[1:]),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation="relu"),
        tf.keras.layers.Dropout(0.2),
        tf.keras.layers.Dense(dataset.num_classes, activation="softmax"),
    ])
    # GradPart paces its deliveries for an adaptive optimizer (docs/algorithm.md, Pacing).
    compression = get_compressor(name)
    # Horovod: scale the learning rate by the number of workers; only `compression` is new.
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.002 * hvd.size()), compression=compression)
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt, metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=epochs, verbose=0,
              # Horovod: start every rank from rank 0's weights.
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
    _, accuracy = model.evaluate(dataset.x_test, dataset.y_test, verbose=0)
    digest = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()
    sparse = metrics.resolve(compression)
    ratio = summary(sparse)["compression_ratio"] if sparse else 1.0
    return hvd.rank(), float(accuracy), float(np.float64(ratio)), digest


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=["gloo", "mpi"], default="gloo")
    parser.add_argument("--compression", nargs="+", default=["none", "gradpart"])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name in args.compression:
        # Horovod: start 2 ranks on this host and collect train's return values, in rank order.
        results = horovod.run(train, args=(name, args.epochs, args.seed), np=2,
                              use_gloo=args.backend == "gloo", use_mpi=args.backend == "mpi")
        ranks, accuracies, ratios, digests = zip(*results)
        if list(ranks) != [0, 1] or len(set(digests)) != 1 or len(set(accuracies)) != 1:
            sys.exit(f"FAIL {name}: ranks {ranks} returned different weights or accuracies {accuracies}")
        print("RESULT " + json.dumps({"compression": name, "optimizer": "adam", "seed": args.seed,
                                      "backend": args.backend, "test_accuracy": accuracies[0],
                                      "ratio": ratios[0]}), flush=True)


if __name__ == "__main__":
    main()
