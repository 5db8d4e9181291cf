"""Elastic Keras ``fit`` with GradPart (Horovod's Keras elastic shape).

    scripts/edge_cluster.sh up --nodes 3
    horovodrun -np 3 --min-np 2 --max-np 3 --host-discovery-script scripts/discover_hosts.sh \
        --blacklist-cooldown-range 10 15 --gloo python scripts/elastic_keras.py --epochs 3

``hvd.elastic.KerasState`` with Horovod's commit and batch/epoch callbacks; through
``hvd_gradpart.elastic.track`` the commits carry every rank's GradPart residuals too, so a rank
that fails rolls the survivors back to weights and residuals of the same commit. At each
epoch's end every rank prints the world size, the weights' CRC (equal on every rank) and its
unsent residual norm; rank 0 prints the test accuracy at the end.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow.keras as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import training  # noqa: E402
from harness.data import DATASETS, load_dataset, shard  # noqa: E402
from harness.models import MODELS, build_model  # noqa: E402
from hvd_gradpart import COMPRESSORS, elastic, get_compressor  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="lenet5")
    p.add_argument("--dataset", choices=DATASETS, default="mnist5k")
    p.add_argument("--compressor", choices=sorted(COMPRESSORS), default="gradpart")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.01, help="per rank; scaled by the number of ranks at each reset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--commit-every", type=int, default=5, help="batches between commits (a failure loses fewer)")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "commit_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    training.limit_threads(1)
    # Horovod: initialize Horovod first (again at every reset, inside the elastic run): the ranks
    # already running wait for a joining one's init no longer than HOROVOD_GLOO_TIMEOUT_SECONDS.
    hvd.init()
    data = load_dataset(args.dataset, seed=args.seed)
    tf.keras.utils.set_random_seed(args.seed)
    model = build_model(args.model, data.x_train.shape[1:], data.num_classes, seed=args.seed)
    compression = get_compressor(args.compressor)
    # Horovod: wrap the optimizer; GradPart sends all gradients in one collective (groups=1).
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9),
                                         compression=compression, groups=1)
    model.compile(optimizer=optimizer, loss=training.LOSS, metrics=["accuracy"])
    # Horovod: the optimizer's variables exist before the state copies them (on joining ranks too).
    optimizer.build(model.trainable_variables)
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    # GradPart's residuals are committed and restored with the weights.
    elastic.track(state, compression)

    def on_reset():
        # Horovod: the learning rate follows the number of ranks.
        optimizer.learning_rate.assign(args.lr * hvd.size())

    state.register_reset_callbacks([on_reset])

    def report(epoch, logs):
        print(json.dumps({"epoch": state.epoch, "rank": hvd.rank(), "size": hvd.size(), "loss": logs["loss"],
                          "crc": elastic.fingerprint(model.variables),
                          "unsent_norm": elastic.unsent_norm(compression)}), flush=True)

    callbacks = [
        # Horovod: commit every few batches and at each epoch's end; keep the batch and epoch.
        hvd.elastic.CommitStateCallback(state, batches_per_commit=args.commit_every),
        hvd.elastic.UpdateBatchStateCallback(state),
        hvd.elastic.UpdateEpochStateCallback(state),
        tf.keras.callbacks.LambdaCallback(on_epoch_end=report),
    ]

    # Horovod: hvd.elastic.run, as hvd_gradpart.elastic.run, which also sees a rank lost in a
    # grouped collective (Horovod 0.28.1's misses it and ends training silently).
    @elastic.run
    def train(state):
        x, y = shard(data.x_train, data.y_train, hvd.rank(), hvd.size())
        state.model.fit(x, y, batch_size=args.batch_size, steps_per_epoch=len(x) // args.batch_size,
                        epochs=args.epochs - state.epoch, callbacks=callbacks, verbose=0)

    train(state)
    accuracy = model.evaluate(data.x_test, data.y_test, batch_size=500, verbose=0)[1]
    if hvd.rank() == 0:
        print(json.dumps({"final": True, "size": hvd.size(), "test_acc": accuracy,
                          "crc": elastic.fingerprint(model.variables)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
