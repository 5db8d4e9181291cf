"""Data-parallel training with a chosen compressor; launch with horovodrun.

    horovodrun -np 2 -H edge-a:1,edge-b:1 python scripts/train.py \
        --model lenet5 --dataset mnist5k --compressor gradpart --epochs 5
"""
import argparse
import contextlib
import hashlib
import math
import os
import socket
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

try:
    from harness import methods, training  # noqa: E402
except ModuleNotFoundError as e:  # `pip install` installs the library alone; the evaluation stays in the clone
    if e.name != "harness":
        raise
    clone = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    raise ImportError(f"scripts/train.py needs the evaluation's package harness/, which `pip install` leaves in "
                      f"the repository: run it with the repository on the path, PYTHONPATH={clone} python "
                      f"{clone}/scripts/train.py ..., after pip install '{clone}[harness]' (the embedded "
                      "datasets' readers)") from None
from harness.data import DATASETS, DataNotFoundError, batches, load_dataset, shard  # noqa: E402
from harness.models import MODELS, build_model  # noqa: E402
from harness.progress import evaluation_points  # noqa: E402
from hvd_gradpart import COMPRESSORS, get_compressor  # noqa: E402
from hvd_gradpart import momentum as hand_over  # noqa: E402
from hvd_gradpart.metrics import JsonlLogger, link_state, rates, resolve, snapshot, totals  # noqa: E402
from launch import child_env  # noqa: E402  (this folder is on the path of a script run from it)


def checked(kind, ok, rule):
    """An argparse type: ``kind(text)``, refused unless ``ok`` holds (``rule`` says what must)."""
    def parse(text):
        value = kind(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value
    return parse


def positive(kind):
    return checked(kind, lambda v: v > 0, "> 0")


count = checked(int, lambda v: v >= 0, ">= 0")
fraction = checked(float, lambda v: 0 < v <= 1, "in (0, 1]")


def exit_with_launcher(rank, host, every_s=1.0):
    """Ends this rank once the process that started it is gone.

    A failed ``horovodrun`` stops its ssh sessions, not the ranks they
    started; without this a rank on another node would linger until one of
    its collectives timed out.
    """
    parent = os.getppid()

    def watch():
        while os.getppid() == parent:
            time.sleep(every_s)
        with contextlib.suppress(OSError):
            print(f"train.py: rank {rank} on {host}: its launcher is gone; exiting", file=sys.stderr, flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


def watched(shown):
    """``metrics.rates``'s figures as text, e.g. ``ratio 76.1x density 0.66% dense 0% link 95.2 Mbit/s``
    (empty for Horovod's own dense compressors)."""
    number = lambda x: f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"
    parts = []
    if "gp_ratio" in shown:
        parts.append(f"ratio {number(shown['gp_ratio'])}x density {100 * shown['gp_density']:.2g}%")
    if "gp_dense_share" in shown:
        parts.append(f"dense {100 * shown['gp_dense_share']:.0f}%")
    if math.isfinite(shown.get("gp_link_mbit", math.nan)):
        parts.append(f"link {number(shown['gp_link_mbit'])} Mbit/s")
    return " ".join(parts)


def report(record, epochs, logger, board, shown):
    """Prints one evaluation (with ``shown``, the compressor's figures since the last one), appends
    it to the JSONL and, at an epoch's end, to TensorBoard."""
    text = watched(shown)
    if record["epoch_end"]:
        print(f"epoch {record['epoch']}/{epochs} step {record['step']} loss {record['train_loss']:.4f} "
              f"test_acc {record['test_acc']:.4f} {text}{', ' if text else ''}"
              f"{record['samples_per_s']:.0f} samples/s, {record['train_s']:.1f} s training", flush=True)
    else:
        print(f"  epoch {record['epoch']:.2f}/{epochs} step {record['step']} test_acc {record['test_acc']:.4f} "
              f"{text}{', ' if text else ''}after {record['train_s']:.1f} s training", flush=True)
    if record.get("stopped"):
        print(f"train.py: stopped at step {record['step']} ({STOPS[record['stopped']]})", flush=True)
    if logger:
        logger.write(**record)
    if board and record["epoch_end"]:
        with board.as_default(step=record["epoch"]):
            for key in ("train_loss", "train_acc", "test_loss", "test_acc", "samples_per_s"):
                tf.summary.scalar(key, record[key])


STOPS = {"stop_at_acc": "--stop-at-acc reached", "max_train_s": "--max-train-s spent",
         "max_steps": "--max-steps done"}


def stop_reason(args, steps, test_acc=None, clock_s=None):
    """Why training ends at this evaluation (a key of ``STOPS``), or None.

    ``test_acc`` and ``clock_s`` (training seconds after the first step) are
    rank 0's: the other ranks pass None and learn its decision by broadcast.
    """
    if args.stop_at_acc is not None and test_acc is not None and test_acc >= args.stop_at_acc:
        return "stop_at_acc"
    if args.max_train_s is not None and clock_s is not None and clock_s >= args.max_train_s:
        return "max_train_s"
    if args.max_steps is not None and steps >= args.max_steps:
        return "max_steps"
    return None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=MODELS, default="lenet5")
    p.add_argument("--dataset", choices=DATASETS, default="mnist5k")
    p.add_argument("--data-dir", help="folder with local files for mnist/cifar10")
    p.add_argument("--compressor", choices=sorted(COMPRESSORS), default="gradpart")
    p.add_argument("--compressor-option", type=methods.option, action="append", default=[], metavar="KEY=VALUE",
                   help="constructor argument of the compressor, e.g. ratio=0.01 (repeatable)")
    p.add_argument("--epochs", type=positive(int),
                   help="epochs to train (default 5, or as many as --max-steps needs when it is given)")
    p.add_argument("--batch-size", type=positive(int), default=32, help="per rank")
    p.add_argument("--lr", type=positive(float), default=0.01, help="per rank; scaled by the rank count")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="cosine: decay the learning rate to 0 over the run (Loshchilov & Hutter 2017)")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (0 for dgc, which has its own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bn-batches", type=count, default=20,
                   help="training batches whose mean statistics replace BatchNorm's moving averages "
                        "before each evaluation (0: keep Keras's moving averages)")
    p.add_argument("--num-groups", type=count, default=1,
                   help="Horovod gradient groups (0: one collective per gradient); a sparse compressor "
                        "sends each group in one allgather")
    p.add_argument("--threads", type=positive(int), default=1, help="TF threads per pool per rank")
    p.add_argument("--eval-every", type=fraction, default=0.25,
                   help="fraction of an epoch between test evaluations (1: at epoch ends only); the training "
                        "clock train_s excludes them")
    p.add_argument("--max-steps", type=positive(int),
                   help="end after this many optimizer steps, evaluating there even within an epoch")
    p.add_argument("--stop-at-acc", type=fraction, metavar="ACC",
                   help="end at the first evaluation whose test accuracy is at least ACC")
    p.add_argument("--max-train-s", type=positive(float), metavar="S",
                   help="end at the first evaluation after S seconds of training clock past the first step "
                        "(train_s - first_step_s)")
    p.add_argument("--jsonl", help="JSONL file with one record per evaluation (rank 0); epoch_end marks the "
                                   "record closing each epoch")
    p.add_argument("--tensorboard", help="TensorBoard log folder (rank 0)")
    p.add_argument("--tensor-jsonl", help="JSONL file for per-tensor compressor metrics (rank 0)")
    p.add_argument("--tensor-every", type=positive(int), default=10, help="steps between --tensor-jsonl records")
    p.add_argument("--steps-jsonl", help="JSONL file for throughput over each --log-every-steps interval of "
                                         "training (evaluations excluded; rank 0)")
    p.add_argument("--log-every-steps", type=positive(int), default=10, help="steps between --steps-jsonl records")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    for flag, path in (("--jsonl", args.jsonl), ("--tensor-jsonl", args.tensor_jsonl),
                       ("--steps-jsonl", args.steps_jsonl)):
        if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
            sys.exit(f"train.py: error: {flag} {path}: no folder {os.path.dirname(os.path.abspath(path))}; "
                     "create it first (a relative path is taken from the working folder of each rank)")
    training.limit_threads(args.threads)
    try:
        data = load_dataset(args.dataset, data_dir=args.data_dir, seed=args.seed)
        compression = get_compressor(args.compressor, **dict(args.compressor_option))
    except (DataNotFoundError, ValueError, TypeError) as e:
        sys.exit(f"train.py: error: {e}")
    # Horovod: launch.py's HOROVOD_DEFAULTS where neither the environment nor
    # horovodrun's flags set them, also when horovodrun starts this script directly.
    _, applied = child_env(os.environ)
    os.environ.update(applied)
    # Horovod: one process per node.
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    hosts = hvd.allgather_object(socket.gethostname())
    if size > 1:
        exit_with_launcher(rank, hosts[rank])
    if rank == 0:
        print("train.py: ranks " + ", ".join(f"{r} on {h}" for r, h in enumerate(hosts)), flush=True)
        if applied:
            print("train.py: Horovod settings " + " ".join(f"{k}={v}" for k, v in applied.items())
                  + " (scripts/launch.py's defaults; set them yourself to override)", flush=True)
    tf.keras.utils.set_random_seed(args.seed)
    x, y = shard(data.x_train, data.y_train, rank, size)
    steps_per_epoch = len(x) // args.batch_size
    args.epochs = args.epochs or (math.ceil(args.max_steps / steps_per_epoch) if args.max_steps else 5)
    model = build_model(args.model, data.x_train.shape[1:], data.num_classes, seed=args.seed)
    momentum = 0.0 if args.compressor == "dgc" else args.momentum
    # Horovod: scale the learning rate by the number of ranks.
    lr = args.lr * size
    if args.lr_schedule == "cosine":
        total = min(args.epochs * steps_per_epoch, args.max_steps or math.inf)
        lr = tf.keras.optimizers.schedules.CosineDecay(lr, total)
    optimizer = tf.keras.optimizers.SGD(lr, momentum=momentum)
    hand_over.follow(compression, optimizer)  # the tape has no optimizer for GradPart to read it from
    step = training.make_step(model, optimizer, compression, num_groups=args.num_groups)
    logger = JsonlLogger(args.jsonl) if args.jsonl and rank == 0 else None
    board = tf.summary.create_file_writer(args.tensorboard) if args.tensorboard and rank == 0 else None
    instance = resolve(compression)
    tensors = JsonlLogger(args.tensor_jsonl) if args.tensor_jsonl and instance is not None and rank == 0 else None
    intervals = JsonlLogger(args.steps_jsonl) if args.steps_jsonl and rank == 0 else None
    points = evaluation_points(steps_per_epoch, args.eval_every)
    seen_totals = totals(compression) if rank == 0 else None  # the printed figures cover each evaluation's interval
    steps, evals, train_s, first_step_s, stop = 0, 0, 0.0, None, None
    start, link0 = time.perf_counter(), training.link_counters()
    mark = start
    for epoch in range(args.epochs):
        epoch_s, seen, loss_sum, hits = 0.0, 0, 0.0, 0.0
        resumed = time.perf_counter()
        for i, (xb, yb) in enumerate(batches(x, y, args.batch_size, args.seed, epoch)):
            loss, hit = step(xb, yb)
            if epoch == 0 and i == 0:
                training.broadcast_initial_state(model, optimizer)
            loss_sum, hits, seen = loss_sum + float(loss) * len(yb), hits + float(hit), seen + len(yb)
            steps += 1
            if steps == 1:  # tracing and compiling; time to accuracy is counted after it
                first_step_s = time.perf_counter() - resumed
            if tensors and steps % args.tensor_every == 0:
                tensors.write(step=steps, epoch=epoch + 1, tensors=snapshot(instance))
            if intervals and steps % args.log_every_steps == 0:
                now = time.perf_counter()
                link = link_state(instance) if instance is not None else {}
                intervals.write(step=steps, epoch=epoch + 1, interval_s=now - mark, wall_s=now - start,
                                samples_per_s=args.log_every_steps * args.batch_size * size / (now - mark),
                                **({"link": link} if link else {}))
                mark = time.perf_counter()  # the interval counts training, not this record
            if i + 1 not in points and steps != args.max_steps:
                continue
            # The training clock stops here: recalibration and evaluation are not training.
            paused = time.perf_counter()
            epoch_s, train_s = epoch_s + paused - resumed, train_s + paused - resumed
            evals += 1
            end = i + 1 == steps_per_epoch
            if args.bn_batches > 0:  # on every rank, from the same data: ranks stay bit-identical
                training.recalibrate_batchnorm(model, data.x_train, args.batch_size, args.bn_batches)
            if rank == 0:
                record = {"epoch": epoch + 1 if end else round(epoch + (i + 1) / steps_per_epoch, 4),
                          "epoch_end": end, "eval": evals, "step": steps, "samples": steps * args.batch_size * size,
                          "train_s": train_s, "first_step_s": first_step_s, "train_loss": loss_sum / seen,
                          "train_acc": hits / seen}
                record["test_loss"], record["test_acc"] = training.evaluate(model, data.x_test, data.y_test)
                link = training.link_counters()
                record.update({
                    "wall_s": time.perf_counter() - start, "samples_per_s": seen * size / epoch_s,
                    "lr": float(lr(optimizer.iterations)) if callable(lr) else lr,  # the next step's
                    "model": args.model, "dataset": args.dataset, "compressor": args.compressor, "ranks": size,
                    "link_tx_bytes": link["tx_bytes"] - link0["tx_bytes"],
                    "link_rx_bytes": link["rx_bytes"] - link0["rx_bytes"],
                    "compression": training.compression_summary(compression)})
                stop = stop_reason(args, steps, record["test_acc"], train_s - first_step_s)
                if stop:
                    record["stopped"] = stop
                now_totals = totals(compression)
                shown = rates(now_totals, seen_totals) if now_totals else {}
                seen_totals = now_totals
                report(record, args.epochs, logger, board, shown)
            else:
                stop = stop_reason(args, steps)
            # Horovod: only rank 0 evaluated; the others wait for it here, off the training clock
            # (not in their next step), and end where it does.
            stop = hvd.broadcast_object(stop, root_rank=0, name="train_stop")
            if stop:
                break
            resumed = time.perf_counter()
            mark += resumed - paused  # --steps-jsonl intervals count training only, as train_s does
        if stop:
            break
    digest = hashlib.sha256(b"".join(v.numpy().tobytes() for v in model.variables)).hexdigest()
    print(f"rank {rank} weights sha256 {digest}", flush=True)


if __name__ == "__main__":
    main()
