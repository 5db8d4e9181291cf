"""Elastic training with GradPart in a ``tf.function`` loop (Horovod's TensorFlow 2 elastic shape).

    scripts/edge_cluster.sh up --nodes 3
    horovodrun -np 3 --min-np 2 --max-np 3 --host-discovery-script scripts/discover_hosts.sh \
        --blacklist-cooldown-range 10 15 --gloo python scripts/elastic_loop.py --epochs 3

Ranks may leave (a node fails, its link goes down) and join (a node comes back; Horovod takes a
failed node in again after its cooldown) while the job runs. The state that
``hvd.elastic.TensorFlowKerasState`` commits every ``--commit-every`` steps holds the model, the
optimizer, the epoch and batch, and, through ``hvd_gradpart.elastic.track``, every rank's
residuals; a failure rolls the survivors back to it. ``--steps-jsonl`` writes one JSON line per step from
every rank (world size, weights' CRC, this rank's unsent residual norm, the applied gradient's
norm); rank 0 prints the test accuracy at the end. ``--stop-file`` ends the job from outside, at
a commit.
"""
import argparse
import itertools
import json
import os
import socket
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import training  # noqa: E402
from harness.data import DATASETS, batches, load_dataset, shard  # noqa: E402
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
    p.add_argument("--commit-every", type=int, default=5, help="steps between commits (a failure loses fewer)")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of sleep per step (to watch a run)")
    p.add_argument("--stop-file", metavar="PATH", help="end at the next commit once PATH exists (rank 0 looks)")
    p.add_argument("--steps-jsonl", metavar="PREFIX", help="one JSONL file per host, PREFIX.HOST.jsonl, one record per step")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "commit_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.steps_jsonl and not os.path.isdir(os.path.dirname(os.path.abspath(args.steps_jsonl))):
        p.error(f"--steps-jsonl {args.steps_jsonl}: no folder {os.path.dirname(os.path.abspath(args.steps_jsonl))}; create it first")
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
    optimizer = tf.keras.optimizers.SGD(args.lr * hvd.size(), momentum=0.9)
    compression = get_compressor(args.compressor)
    host = socket.gethostname()
    log = open(f"{args.steps_jsonl}.{host}.jsonl", "a") if args.steps_jsonl else None

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = training.LOSS(y, model(x, training=True))
        # Horovod: exchange the gradients through GradPart, all of them in one collective.
        tape = hvd.DistributedGradientTape(tape, compression=compression, groups=1)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss, tf.linalg.global_norm(grads)

    # Horovod: the optimizer's variables exist before the state copies them (on joining ranks too).
    optimizer.build(model.trainable_variables)
    state = hvd.elastic.TensorFlowKerasState(model, optimizer, epoch=0, batch=0, steps=0)
    # GradPart's residuals are committed and restored with the weights.
    elastic.track(state, compression)

    def on_reset():
        # Horovod: the learning rate follows the number of ranks.
        optimizer.learning_rate.assign(args.lr * hvd.size())

    state.register_reset_callbacks([on_reset])

    # Horovod: hvd.elastic.run, as hvd_gradpart.elastic.run, which also sees a rank lost in a
    # grouped collective (Horovod 0.28.1's misses it and ends training silently).
    @elastic.run
    def train(state):
        rank, size = hvd.rank(), hvd.size()
        x, y = shard(data.x_train, data.y_train, rank, size)
        for state.epoch in range(state.epoch, args.epochs):
            epoch = batches(x, y, args.batch_size, args.seed, state.epoch)
            for xb, yb in itertools.islice(epoch, state.batch, None):
                loss, norm = step(xb, yb)
                state.batch, state.steps = state.batch + 1, state.steps + 1
                if log:
                    log.write(json.dumps({
                        "t": time.time(), "pid": os.getpid(), "host": host, "rank": rank, "size": size,
                        "epoch": state.epoch, "batch": state.batch, "steps": state.steps, "loss": float(loss),
                        "grad_norm": float(norm), "unsent_norm": elastic.unsent_norm(compression),
                        "crc": elastic.fingerprint(model.variables)}) + "\n")
                    log.flush()
                time.sleep(args.step_delay)
                if state.steps % args.commit_every == 0:
                    state.commit()
                    # Horovod: every rank ends where rank 0 sees the stop file.
                    if args.stop_file and hvd.broadcast_object(os.path.exists(args.stop_file), name="stop"):
                        return
            state.batch = 0
            state.commit()

    train(state)
    accuracy = training.evaluate(model, data.x_test, data.y_test)[1]
    if hvd.rank() == 0:
        print(json.dumps({"final": True, "steps": state.steps, "size": hvd.size(), "test_acc": accuracy,
                          "crc": elastic.fingerprint(model.variables)}), flush=True)


if __name__ == "__main__":
    sys.exit(main())
