"""The keyed exchange under horovodrun (any rank count): exact, one shape on every rank, shared
state alike, Horovod's reductions, a NaN on one rank, a disagreement, training in a group.

Expectations are computed here from every rank's accumulated values, gathered with plain
``hvd.allgather``, independently of the exchange.
"""
import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, gather_np, init, ok
from hvd_gradpart import KeyedCompressor, KeyedResearch, metrics

RANK, SIZE = init()
N = 8192


def rank_input(step, n=N):
    rng = np.random.RandomState(1000 * step + RANK)
    signal = np.random.RandomState(step).randn(n) * (np.arange(n) % 97 == 0) * 5  # shared large coordinates
    return (rng.randn(n) * 0.1 + signal).astype(np.float32)


def check_exact_over_steps(op, scale, encoding="native"):
    """Error feedback is exact over ranks: each step's result is the reduction of what every rank
    took out of its accumulated values (``acc - residual``), each rank either sent an element
    (its residual then holds what float16 rounding removed, with ``encoding="fp16"``) or kept it
    whole, and the shared state is bit-identical."""
    comp = KeyedCompressor(value_encoding=encoding)
    wire = np.float16 if encoding == "fp16" else np.float32
    run = tf.function(lambda t: hvd.allreduce(t, compression=comp, op=op))
    residual = np.zeros(N, np.float32)
    sizes = []
    for step in range(6):
        acc = residual + rank_input(step)
        got = run(tf.constant(rank_input(step))).numpy()
        slot = next(iter(comp.memory.slots.values()))
        residual = slot.residual.numpy()
        rounded = acc.astype(wire).astype(np.float32)
        check(np.all((residual == acc) | (residual == acc - rounded)), f"step {step}: a residual is neither kept "
              "nor what was sent took out")
        taken = gather_np(acc - residual).sum(0) * scale
        tolerance = 2e-3 if encoding == "fp16" else 1e-5
        check(np.allclose(got, taken, rtol=tolerance, atol=1e-5), f"step {step}: the result is not the reduction "
              "of what the ranks sent")
        assert_same_on_all_ranks([got, *[v.numpy() for v in comp.shared(slot)]], f"step {step} shared state")
        sizes.append(int(slot.metrics.read()["key_size"]))
    check(sizes[0] == 0 and max(sizes[1:]) > 0, f"key areas {sizes}: the first is empty, nominations fill later ones")
    ok(f"exact under {op}, {encoding} (key areas {sizes})")


def check_nan_on_one_rank():
    comp = KeyedCompressor()
    run = tf.function(lambda t: hvd.allreduce(t, compression=comp, op=hvd.Sum))
    for step in range(3):
        run(tf.constant(rank_input(step)))
    slot = next(iter(comp.memory.slots.values()))
    kept = [v.numpy().copy() for v in slot.rank_local()]
    bad = rank_input(3)
    if RANK == SIZE - 1:
        bad[5] = np.inf
    got = run(tf.constant(bad)).numpy()
    check(not np.isfinite(got).all(), "an Inf on one rank: the sum is finite")
    for before, v in zip(kept, slot.rank_local()):
        check(np.array_equal(before, v.numpy()), f"an Inf on one rank: {v.name} changed")
    check(np.isfinite(run(tf.constant(rank_input(4))).numpy()).all(), "the next finite step is not finite")
    ok("an Inf on one rank makes every rank's sum not finite and keeps every rank's state")


def check_disagreement():
    research = KeyedResearch(margin=0.0 if RANK == 0 else 3.0)
    comp = KeyedCompressor(research=research)
    run = tf.function(lambda t: hvd.allreduce(t, compression=comp, op=hvd.Sum))
    try:
        for step in range(6):
            run(tf.constant(rank_input(step)))
    except (tf.errors.InvalidArgumentError, tf.errors.FailedPreconditionError) as e:
        check("ranks disagree" in e.message or "Mismatched" in e.message, f"unclear error: {e.message[:300]}")
        print(f"OK rank {RANK}: a disagreement stopped with an error", flush=True)
        return
    check(False, "ranks with different settings trained on")


def grouped_training(compression):
    """Trains 40 steps under the tape with ``groups=1``; returns the weights and the loss before and after."""
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(128, activation="tanh"),
                                 tf.keras.layers.Dense(10)])
    opt = tf.keras.optimizers.SGD(0.2, momentum=0.9)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    teacher = np.random.RandomState(42).randn(64, 10).astype(np.float32)
    x_eval = np.random.RandomState(9).randn(512, 64).astype(np.float32)
    y_eval = np.argmax(x_eval @ teacher, 1)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression, groups=1)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    before = float(loss_fn(y_eval, model(x_eval)))
    for s in range(40):
        x = np.random.RandomState(100 * s + RANK).randn(32, 64).astype(np.float32)
        step(x, np.argmax(x @ teacher, 1))
    return [v.numpy() for v in model.trainable_variables], before, float(loss_fn(y_eval, model(x_eval)))


def check_grouped_training():
    weights, before, after = grouped_training(KeyedCompressor)
    _, _, dense = grouped_training(hvd.Compression.none)
    assert_same_on_all_ranks(weights, "grouped weights")
    print(f"grouped: loss {before:.3f} -> keyed {after:.3f}, none {dense:.3f}", flush=True)
    check(before - after > 0.6 * (before - dense),
          f"grouped training: loss {before:.3f} -> {after:.3f}, none {dense:.3f}")
    slots = metrics.resolve(KeyedCompressor).memory.slots.values()
    check(all(slot.delivered is not None for slot in slots),
          "under a tape, nothing set: the sums were not handed to the step's SGD momentum")
    ok(f"trains in a group (groups=1), ranks bit-identical, loss {before:.3f} -> {after:.3f} (none {dense:.3f}), "
       "the sums handed to the momentum the step's optimizer has")


if __name__ == "__main__":
    check_exact_over_steps(hvd.Sum, 1.0)
    check_exact_over_steps(hvd.Average, 1.0 / SIZE)
    check_exact_over_steps(hvd.Sum, 1.0, "fp16")
    check_nan_on_one_rank()
    check_grouped_training()
    check_disagreement()
