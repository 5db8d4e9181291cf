"""The grouped exchange under horovodrun: one allgather per Horovod group.

Checks: how many collectives a traced step holds with and without groups;
exact sums for a group mixing float16/float32/float64, tensors below
``min_elements`` and a scalar (eager and traced, Sum and Average), and for a
group of int tensors (Horovod's grouped allreduce takes one dtype, so ints
group only with ints, with any compression); a rank selecting nothing; training through ``DistributedGradientTape`` and
Keras ``DistributedOptimizer`` with ``num_groups=1`` (ranks bit-identical,
everything sent equals dense); the one-time hint on the per-tensor path;
ranks whose groups disagree stop with the exchange's error (eagerly, where
every collective of the failed call has finished before the check raises;
tests/parallel/mismatch_check.py covers a traced step).
"""
import collections
import logging
import math

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf

from common import NothingAnywhere, NothingOnRank1, assert_same_on_all_ranks, check, gather_np, init, ok
from hvd_gradpart import TopKCompressor

RANK, SIZE = init()
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
RATIO = 0.02


def distinct(n, dtype, seed):
    """Rank-dependent values with distinct magnitudes, exact in every float dtype (no top-k ties)."""
    rs = np.random.RandomState(1000 * seed + RANK)
    return (rs.choice([-1.0, 1.0], n) * (rs.permutation(n) + 1) / 64).astype(dtype)


def topk_np(x, ratio=RATIO):
    k = max(1, math.ceil(ratio * x.size))
    flat, out = x.reshape(-1), np.zeros(x.size, x.dtype)
    idx = np.argsort(-np.abs(flat), kind="stable")[:k]
    out[idx] = flat[idx]
    return out.reshape(x.shape)


def sparse_sum(x, ratio=RATIO, skip=()):
    """What the exchange must return for op=Sum: every rank's top-k, summed in float32 or wider."""
    acc = np.float64 if x.dtype == np.float64 else np.float32
    every = gather_np(x)
    total = sum(topk_np(every[r], ratio).astype(acc) for r in range(SIZE) if r not in skip)
    return np.asarray(total, acc).astype(x.dtype)


def mixed_group(seed):
    """Sparse float16/float32/float64, then small float32/float64 and a float16 scalar (dense)."""
    return [distinct(2048, np.float16, seed), distinct(4096, np.float32, seed + 1).reshape(64, 64),
            distinct(3000, np.float64, seed + 2), distinct(10, np.float32, seed + 3),
            distinct(7, np.float64, seed + 4), np.float16(RANK + 1.5)]


def op_counts(fn, *args):
    """Op types in a traced function, its branch functions included."""
    graph_def = fn.get_concrete_function(*args).graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return collections.Counter(n.op for n in nodes)


def check_mixed_group():
    xs = mixed_group(1)
    dense_sum = [gather_np(x.astype(np.float64)).sum(0) for x in xs[3:]]
    for mode in ("eager", "function"):
        for op in (hvd.Sum, hvd.Average):
            comp = TopKCompressor(ratio=RATIO)
            run = lambda *t: hvd.grouped_allreduce(list(t), compression=comp, op=op)  # noqa: B023
            outs = (tf.function(run) if mode == "function" else run)(*map(tf.constant, xs))
            what = f"{mode} {'Sum' if op == hvd.Sum else 'Average'}"
            div = 1 if op == hvd.Sum else SIZE
            for x, got in zip(xs[:3], outs[:3]):
                want = sparse_sum(x)
                check(got.dtype == x.dtype and got.shape == x.shape, f"{what}: {x.dtype} came back as {got}")
                exact = want.astype(np.float64) / div
                check(np.allclose(got.numpy().astype(np.float64), exact, rtol=1e-3 if x.dtype == np.float16 else 1e-6),
                      f"{what}: wrong sparse sum for {x.dtype}{x.shape}")
            for x, got, want in zip(xs[3:], outs[3:], dense_sum):
                check(got.dtype == x.dtype and got.shape == x.shape, f"{what}: dense {x.dtype} came back as {got}")
                check(np.allclose(got.numpy().astype(np.float64), want / div), f"{what}: dense {x.dtype} wrong")
            check(len(comp.memory.slots) == 3, f"{what}: expected 3 sparse slots, got {list(comp.memory.slots)}")
            assert_same_on_all_ranks([np.atleast_1d(o.numpy()) for o in outs], what)
    sums = hvd.grouped_allreduce([tf.constant(x) for x in xs[:3]], compression=TopKCompressor(ratio=RATIO),
                                 op=hvd.Sum)
    for x, got in zip(xs[:3], sums):
        check(np.array_equal(got.numpy(), sparse_sum(x)), f"eager Sum: {x.dtype} not bit-exact")
    ints = [np.arange(100, dtype=np.int32) * (RANK + 1), np.arange(6, dtype=np.int32).reshape(2, 3) - RANK]
    comp = TopKCompressor()
    outs = tf.function(lambda *t: hvd.grouped_allreduce(list(t), compression=comp, op=hvd.Sum))(*ints)
    for x, got in zip(ints, outs):
        check(got.dtype == x.dtype and np.array_equal(got.numpy(), gather_np(x).sum(0)), f"{x.dtype} group wrong")
    ok("mixed float16/float32/float64, small and scalar tensors in one group; int groups pass through")


def check_empty_selections():
    xs = [distinct(2048, np.float32, 5), distinct(1500, np.float64, 6), distinct(4096, np.float16, 7)]
    comp = NothingOnRank1(ratio=RATIO)
    outs = tf.function(lambda *t: hvd.grouped_allreduce(list(t), compression=comp, op=hvd.Sum))(*xs)
    for x, got in zip(xs, outs):
        check(np.array_equal(got.numpy(), sparse_sum(x, skip=(1,))), f"rank 1 empty: {x.dtype} sum wrong")
    outs = hvd.grouped_allreduce([tf.constant(x) for x in xs], compression=NothingAnywhere(), op=hvd.Sum)
    check(all(not np.any(o.numpy()) for o in outs), "nobody selecting: not zero")
    ok("a rank selecting nothing in a group finishes")


def make_model():
    """Mixed dtypes: float32, float64 and float16 kernels large enough to sparsify, small ones dense."""
    tf.keras.utils.set_random_seed(7)
    return tf.keras.Sequential([
        tf.keras.Input((32,)), tf.keras.layers.Dense(64, activation="tanh"),
        tf.keras.layers.Dense(64, activation="tanh", dtype="float64"),
        tf.keras.layers.Dense(32, activation="tanh", dtype="float16"), tf.keras.layers.Dense(10)])


def batch(step, size=16):
    rs = np.random.RandomState(100 * step + RANK)
    return rs.randn(size, 32).astype(np.float32), rs.randint(0, 10, size).astype(np.int32)


def tape_step(model, opt, compression, **kwargs):
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, tf.cast(model(x, training=True), tf.float32))
        tape = hvd.DistributedGradientTape(tape, compression=compression, **kwargs)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return step


def train_tape(compression, mode, steps=3, **kwargs):
    model = make_model()
    step = tape_step(model, tf.keras.optimizers.SGD(0.1), compression, **kwargs)
    step = tf.function(step) if mode == "function" else step
    for s in range(steps):
        step(*batch(s))
    return [v.numpy() for v in model.trainable_variables]


def close(a, b):
    return all(np.allclose(x.astype(np.float64), y.astype(np.float64), rtol=2e-3 if x.dtype == np.float16 else 1e-5,
                           atol=2e-3 if x.dtype == np.float16 else 1e-6) for x, y in zip(a, b))


def check_collective_count():
    x, y = batch(0)
    # Without groups: 3 sparse kernels and the float64 and float16 biases (carried whole) gather apart.
    for kwargs, gathers in ((dict(num_groups=1), 1), (dict(num_groups=2), 2), (dict(), 5)):
        model = make_model()
        step = tf.function(tape_step(model, tf.keras.optimizers.SGD(0.1), TopKCompressor(ratio=RATIO), **kwargs))
        counts = op_counts(step, x, y)
        check(counts["HorovodAllgather"] == gathers,
              f"{kwargs}: expected {gathers} allgather(s), found {counts['HorovodAllgather']}")
    ok("a traced step holds one allgather per Horovod group (5 per step without groups)")


def check_training():
    variants = [dict(num_groups=1), dict(num_groups=1, op=hvd.Sum), dict(num_groups=1, gradient_predivide_factor=2.0)]
    # tests/parallel/training_check.py runs every variant eagerly without groups; eager here checks the default.
    for mode, kwargs in [("eager", variants[0])] + [("function", v) for v in variants]:
        what = f"DistributedGradientTape {mode} {kwargs}"
        sparse = train_tape(TopKCompressor(ratio=0.05), mode, **kwargs)
        assert_same_on_all_ranks(sparse, what)
        everything = train_tape(TopKCompressor(ratio=1.0), mode, **kwargs)
        # Horovod's own grouped allreduce refuses this model's mixed dtypes: compare with ungrouped dense.
        dense = train_tape(hvd.Compression.none, mode, **{k: v for k, v in kwargs.items() if k != "num_groups"})
        check(close(everything, dense), f"{what}: ratio=1 differs from dense")
        check(not close(sparse, dense), f"{what}: ratio=0.05 looks dense")
    ok("DistributedGradientTape num_groups=1 eager/function, Average/Sum/predivide, mixed dtypes")


def train_keras(compression, **kwargs):
    model = make_model()
    opt = hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression, **kwargs)
    model.compile(optimizer=opt, loss=lambda y, logits: LOSS(y, tf.cast(logits, tf.float32)))
    x, y = zip(*(batch(s) for s in range(3)))
    model.fit(np.concatenate(x), np.concatenate(y), batch_size=16, epochs=2, shuffle=False, verbose=0)
    return [v.numpy() for v in model.trainable_variables]


def check_keras():
    sparse = train_keras(TopKCompressor(ratio=0.05), num_groups=1)
    assert_same_on_all_ranks(sparse, "keras fit num_groups=1")
    check(close(train_keras(TopKCompressor(ratio=1.0), num_groups=1), train_keras(hvd.Compression.none)),
          "keras fit num_groups=1: ratio=1 differs from dense")
    ok("Keras model.fit with horovod.tensorflow.keras.DistributedOptimizer(num_groups=1)")


class Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def check_hint():
    records = Records()
    logging.getLogger("hvd_gradpart").addHandler(records)
    train_tape(TopKCompressor(ratio=0.05), "function", num_groups=1)
    train_tape(TopKCompressor(ratio=0.05), "function", num_groups=8)  # groups of one are still grouped
    check(not records.messages, f"grouped exchange logged {records.messages}")
    comp = TopKCompressor(ratio=0.05)
    model = make_model()
    step = tf.function(tape_step(model, tf.keras.optimizers.SGD(0.1), comp))
    step(*batch(0, 16))
    step(*batch(1, 8))  # a retrace
    hints = [m for m in records.messages if "groups=1" in m]
    check(len(hints) == (1 if RANK == 0 else 0), f"rank {RANK}: expected the hint once on rank 0, got {hints}")
    ok("the per-tensor path logs its hint once, on rank 0")


def expect_mismatch(run, what):
    try:
        run()
    except tf.errors.InvalidArgumentError as e:
        text = str(e)
        check("ranks disagree" in text and "same compressor settings" in text, f"{what}: unclear error {text[:400]}")
        return
    check(False, f"{what}: ranks disagreed and nothing stopped them")


def check_disagreement():
    base = [tf.constant(distinct(2048, np.float32, 9)), tf.constant(distinct(4096, np.float32, 10))]
    settings = lambda: hvd.grouped_allreduce(base, compression=TopKCompressor(ratio=0.01 * (1 + RANK)))
    expect_mismatch(settings, "settings differ")
    shape = [base[0], tf.constant(distinct(4096 + 1024 * RANK, np.float32, 11))]
    expect_mismatch(lambda: hvd.grouped_allreduce(shape, compression=TopKCompressor(ratio=RATIO)), "shape differs")
    dtype = [base[0], tf.constant(distinct(4096, np.float32 if RANK == 0 else np.float64, 12))]
    expect_mismatch(lambda: hvd.grouped_allreduce(dtype, compression=TopKCompressor(ratio=RATIO)), "dtype differs")
    ok("ranks whose groups disagree stop with a clear error")


check_collective_count()
check_mixed_group()
check_empty_selections()
check_training()
check_keras()
check_hint()
check_disagreement()
ok(f"grouped checks passed on {SIZE} ranks")
