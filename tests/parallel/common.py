"""Helpers for scripts run under horovodrun."""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from hvd_gradpart import TopKCompressor  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)


def init():
    hvd.init()
    return hvd.rank(), hvd.size()


def gather_np(x):
    """Every rank's copy of ``x`` stacked along a new first axis."""
    x = tf.convert_to_tensor(x)
    return hvd.allgather(x[None]).numpy()


def assert_same_on_all_ranks(arrays, what):
    """Fails unless every rank holds bit-identical ``arrays``."""
    for i, a in enumerate(arrays):
        every = gather_np(a)
        for r in range(1, len(every)):
            if not np.array_equal(every[0].view(np.uint8), every[r].view(np.uint8)):
                fail(f"{what}[{i}] differs between rank 0 and rank {r}")


def check(condition, message):
    if not condition:
        fail(message)


def fail(message):
    print(f"FAIL rank {hvd.rank()}: {message}", flush=True)
    sys.stdout.flush()
    os._exit(1)


def ok(name):
    if hvd.rank() == 0:
        print(f"OK {name}", flush=True)


class NothingOnRank1(TopKCompressor):
    """Rank 1 selects nothing; the others select their top-k."""

    def select(self, swept, grad, slot):
        if hvd.rank() == 1:
            return tf.zeros([0], tf.int32), {}
        return super().select(swept, grad, slot)


class NothingAnywhere(TopKCompressor):
    """No rank selects anything."""

    def select(self, swept, grad, slot):
        return tf.zeros([0], tf.int32), {}
