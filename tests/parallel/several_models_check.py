"""Several models trained one after another in one process, each on slots of its own.

Every sparse method of the registry, passed as the class (so one default
instance serves every model): Keras ``fit``; ``train_on_batch`` with
``backward_passes_per_step=2``; an Embedding model with
``sparse_as_dense=True``, then one with ``backward_passes_per_step=2``; a
``tf.function`` tape loop made from one Python function for each model. The
second model gets new slots, uses them, and leaves the first one's slots as
they were. Two models of the same shapes one after the other: the second
ends bit-identical (weights and every slot variable) to the same model
trained with a fresh compressor, which it would not if it had inherited the
first one's unsent gradient (GradPart, whose link budget follows measured times, ends with the
same per-slot step counts instead). With Top-k: a GAN's two halves (two Horovod
optimizers in one ``train_step``); a recompiled Keras model keeps its slots;
what nothing can tell apart fails at once, before any step (a second Keras
model of the same shapes through the class, an eager loop running a second
model through Horovod's one traced allreduce). Each failing case is
reported and the next one runs.

Usage: ``horovodrun -np 2 python several_models_check.py``.
"""
import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, init, ok
from hvd_gradpart import COMPRESSORS, BaseCompressor, TopKCompressor

RANK, SIZE = init()
SPARSE = {name: method for name, method in sorted(COMPRESSORS.items())
          if isinstance(method, type) and issubclass(method, BaseCompressor)}
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
BATCH, STEPS = 16, 4


def batches(x, y):
    return [(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH]) for s in range(STEPS)]


def data(seed):
    rs = np.random.RandomState(100 * seed + RANK)
    return rs.randn(STEPS * BATCH, 32).astype(np.float32), rs.randint(0, 10, STEPS * BATCH).astype(np.int32)


def words(seed):
    rs = np.random.RandomState(100 * seed + RANK)
    return (rs.randint(0, 200, (STEPS * BATCH, 8)).astype(np.int32),
            rs.randint(0, 10, STEPS * BATCH).astype(np.int32))


def mlp(width, seed=3):
    """Models through Keras each have a ``width`` of their own, unless a case wants the same
    shapes: Horovod's cached allreduce refuses a second model of the same shapes through the class."""
    tf.keras.utils.set_random_seed(seed)
    return tf.keras.Sequential([tf.keras.Input((32,)), tf.keras.layers.Dense(width, activation="tanh"),
                                tf.keras.layers.Dense(10)])


def embedding():
    tf.keras.utils.set_random_seed(3)
    return tf.keras.Sequential([tf.keras.Input((8,), dtype="int32"), tf.keras.layers.Embedding(200, 16),
                                tf.keras.layers.Flatten(), tf.keras.layers.Dense(10)])


def keras(model, compression, batch_by_batch=False, seed=1, inputs=data, **options):
    """Trains ``model`` through Horovod's Keras optimizer, with ``fit`` or ``train_on_batch``."""
    model.compile(optimizer=hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.1), compression=compression,
                                                      **options), loss=LOSS)
    x, y = inputs(seed)
    if batch_by_batch:
        for xb, yb in batches(x, y):
            model.train_on_batch(xb, yb)
    else:
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    return model


def tape_loop(model, compression, seed=1):
    """Trains ``model`` in a ``tf.function`` step made from the same Python function every time."""
    opt = tf.keras.optimizers.SGD(0.1)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    step = tf.function(step)
    for xb, yb in batches(*data(seed)):
        step(xb, yb)
    return model


def eager_loop(model, compression):
    """Trains ``model`` eagerly: Horovod traces one allreduce for every model that shares ``compression``."""
    opt = tf.keras.optimizers.SGD(0.1)
    for xb, yb in batches(*data(1)):
        with tf.GradientTape() as tape:
            loss = LOSS(yb, model(xb, training=True))
        tape = hvd.DistributedGradientTape(tape, compression=compression)
        opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    return model


class TwoHalves(tf.keras.Model):
    """A GAN's shape: one ``train_step`` updating two sub-models through two Horovod optimizers."""

    def __init__(self):
        super().__init__()
        tf.keras.utils.set_random_seed(3)
        self.g = tf.keras.Sequential([tf.keras.Input((16,)), tf.keras.layers.Dense(80)])
        self.d = tf.keras.Sequential([tf.keras.Input((80,)), tf.keras.layers.Dense(48, activation="tanh"),
                                      tf.keras.layers.Dense(1)])

    def compile(self, compression):
        super().compile()
        self.g_opt, self.d_opt = (hvdk.DistributedOptimizer(tf.keras.optimizers.SGD(0.01), compression=compression)
                                  for _ in range(2))

    def train_step(self, real):
        z = tf.random.stateless_normal([tf.shape(real)[0], 16], [RANK, 0])
        with tf.GradientTape() as tape:
            d_loss = tf.reduce_mean(self.d(self.g(z))) - tf.reduce_mean(self.d(real))
        self.d_opt.minimize(d_loss, self.d.trainable_variables, tape=tape)
        with tf.GradientTape() as tape:
            g_loss = -tf.reduce_mean(self.d(self.g(z)))
        self.g_opt.minimize(g_loss, self.g.trainable_variables, tape=tape)
        return {"d": d_loss, "g": g_loss}


def two_halves(compression):
    model = TwoHalves()
    model.compile(compression)
    model.fit(np.random.RandomState(RANK).randn(STEPS * BATCH, 80).astype(np.float32), batch_size=BATCH, verbose=0)
    return model


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def weights(model):
    return [v.numpy() for v in model.trainable_variables]


def state(compressor):
    """Every slot's variables (residual, method state, metrics) by key, in creation order."""
    return {key: [v.numpy() for v in slot.variables] for key, slot in compressor.memory.slots.items()}


def one_after_another(method, what, first, second):
    """Two trainings through ``method``'s default instance: the second makes slots of its own,
    uses them, and leaves the first one's untouched."""
    compressor = method.instance()
    before = state(compressor)
    trained = weights(first())
    after_first = state(compressor)
    trained += weights(second())
    after_second = state(compressor)
    mine, theirs = set(after_first) - set(before), set(after_second) - set(after_first)
    expect(mine and theirs, f"slots {sorted(mine)} then {sorted(theirs)}: a model got none of its own")
    expect(all(compressor.memory.slots[k].metrics.read()["steps"] > 0 for k in theirs),
           "the second model did not use its slots")
    expect(all(same(after_second[k], v) for k, v in after_first.items()),
           "training the second model changed the first one's slots")
    assert_same_on_all_ranks(trained, f"{what} weights")
    ok(f"{what}: each model its own slots ({min(mine)}..., {min(theirs)}...)")


def same_shapes_do_not_leak(name, method):
    """Model B after model A, of the same shapes: B ends as B trained with a fresh compressor, weights
    and every slot variable bit for bit (shared slots would carry A's residuals, method state and
    counters into B)."""
    first = tape_loop(mlp(112), method)
    earlier = set(method.instance().memory.slots)
    second = tape_loop(mlp(112, seed=4), method, seed=2)
    theirs = [v for k, v in state(method.instance()).items() if k not in earlier]
    fresh = method()
    alone = tape_loop(mlp(112, seed=4), fresh, seed=2)
    if getattr(fresh, "budgets", None):
        # GradPart follows the link: what it sends depends on the times each step measures, so
        # two runs are not bit-identical; shared slots would still carry the first model's counts
        counts = lambda c, keys: sorted(c.memory.slots[k].metrics.read()["steps"] for k in keys)
        mine = [k for k in method.instance().memory.slots if k not in earlier]
        expect(len(theirs) == 2 and counts(method.instance(), mine) == counts(fresh, fresh.memory.slots),
               "the second model's slots counted other steps than the same model's trained alone")
    else:
        expect(same(weights(second), weights(alone)),
               "the second model's weights differ from the same model trained alone: the first one's state leaked")
        expect(len(theirs) == 2 and same(sum(theirs, []), sum(state(fresh).values(), [])),
               f"the second model's {len(theirs)} slots differ from the same model's trained alone")
    expect(not same(weights(first), weights(second)), "the two models ended equal, so the check proves nothing")
    ok(f"{name}: two models of the same shapes: the second is as it is trained alone (no leak)")


def recompiled_model_keeps_its_slots():
    model = keras(mlp(352), TopKCompressor)
    slots = state(TopKCompressor.instance())
    keras(model, TopKCompressor, seed=2)
    expect(sorted(state(TopKCompressor.instance())) == sorted(slots), "a recompile made new slots")
    ok("a recompiled Keras model keeps its slots")


def fails_at_once(what, train, model):
    """``train()`` must raise at once, advising an instance per model, before ``model`` changes."""
    start = weights(model)
    try:
        train()
    except ValueError as e:
        expect("compression=TopKCompressor()" in str(e), f"the error gives no advice: {e}")
        expect(same(start, weights(model)), "the model changed before the error")
        ok(f"{what} fails at once: {str(e).strip().splitlines()[-1][:100]}...")
        return
    expect(False, "it trained without an error")


def same_shapes_through_the_class():
    """Horovod hands a second model of the same shapes the first one's traced allreduce."""
    second = mlp(352, seed=4)
    fails_at_once("a second Keras model of the same shapes through the class",
                  lambda: keras(second, TopKCompressor, seed=2), second)
    keras(mlp(352), TopKCompressor())
    keras(second, TopKCompressor(), seed=2)
    alone = keras(mlp(352, seed=4), TopKCompressor(), seed=2)
    expect(same(weights(second), weights(alone)), "with an instance each, the second model differs from it alone")
    ok("the same Keras models with an instance each: the second is bit-identical to it trained alone")


def eager_loops():
    eager_loop(mlp(384), TopKCompressor)
    second = mlp(416)
    fails_at_once("an eager loop with a second model through the class",
                  lambda: eager_loop(second, TopKCompressor), second)


failures = []


def case(what, run):
    """Runs one case; a failure is reported and the next case runs (the state a case leaves in the
    default instances and in Horovod's cache is the same on every rank)."""
    try:
        run()
    except Exception as e:  # noqa: BLE001 - every failing case is reported
        failures.append(what)
        print(f"FAIL rank {RANK}: {what}: {type(e).__name__}: {str(e).strip().splitlines()[-1][:400]}", flush=True)


for name, method in SPARSE.items():
    case(f"{name}: Keras fit", lambda: one_after_another(
        method, f"{name}: Keras fit", lambda: keras(mlp(96), method), lambda: keras(mlp(128), method)))
    case(f"{name}: train_on_batch", lambda: one_after_another(
        method, f"{name}: train_on_batch, backward_passes_per_step=2",
        lambda: keras(mlp(160), method, True, backward_passes_per_step=2),
        lambda: keras(mlp(192), method, True, backward_passes_per_step=2)))
    case(f"{name}: Embedding", lambda: one_after_another(
        method, f"{name}: Embedding with sparse_as_dense, then backward_passes_per_step=2",
        lambda: keras(embedding(), method, inputs=words, sparse_as_dense=True),
        lambda: keras(mlp(224), method, True, backward_passes_per_step=2)))
    case(f"{name}: tape loops", lambda: one_after_another(
        method, f"{name}: tape loops in tf.function", lambda: tape_loop(mlp(256), method),
        lambda: tape_loop(mlp(288), method)))
    case(f"{name}: same shapes", lambda: same_shapes_do_not_leak(name, method))
case("GAN", lambda: one_after_another(
    TopKCompressor, "topk: a GAN's two halves in one train_step, then a Keras model",
    lambda: two_halves(TopKCompressor), lambda: keras(mlp(320), TopKCompressor)))
case("recompile", recompiled_model_keeps_its_slots)
case("same shapes through the class", same_shapes_through_the_class)
case("eager loops", eager_loops)
check(not failures, f"{len(failures)} cases failed: {failures}")
ok(f"several-models checks passed on {SIZE} ranks")
