"""Error feedback's sums handed to a momentum optimizer: it applies each sum once."""
import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart import GradPartCompressor, TopKCompressor, momentum
from hvd_gradpart.elastic import CompressorState

hvd.init()


@pytest.mark.parametrize("beta", [0.5, 0.9])
def test_sgd_with_momentum_moves_the_weights_by_each_sum_once(beta):
    """Keras SGD fed the hand-over of sums s_t moves the weights by lr s_t / (1 - beta) at
    step t, nothing more: its velocity never repeats an earlier sum."""
    lr, rng = 0.1, np.random.default_rng(0)
    delivered, w = tf.Variable(tf.zeros([64])), tf.Variable(tf.zeros([64]))
    optimizer = tf.keras.optimizers.SGD(lr, momentum=beta)
    for _ in range(8):
        s = np.where(rng.random(64) < 0.1, rng.normal(size=64), 0.0).astype(np.float32)  # a burst here and there
        before = w.numpy()
        optimizer.apply_gradients([(momentum.hand_over(tf.constant(s), delivered, beta), w)])
        np.testing.assert_allclose(before - w.numpy(), lr * s / (1 - beta), rtol=1e-4, atol=1e-6)


def test_what_is_handed_over_adds_up_to_the_sums():
    beta, rng = 0.9, np.random.default_rng(1)
    delivered = tf.Variable(tf.zeros([32]))
    sums = rng.normal(size=(20, 32)).astype(np.float32)
    handed = sum(momentum.hand_over(tf.constant(s), delivered, beta).numpy() for s in sums)
    # sum of d_t = sum of s_t + beta / (1 - beta) s_T: the velocity still holds the last sum
    np.testing.assert_allclose(handed, sums.sum(0) + beta / (1 - beta) * sums[-1], rtol=1e-4, atol=1e-4)


def test_a_sum_that_is_not_finite_passes_and_the_last_sum_stays():
    delivered = tf.Variable(tf.fill([4], 2.0))
    out = momentum.hand_over(tf.constant([1.0, np.nan, 1.0, 1.0]), delivered, 0.9)
    assert not np.isfinite(out.numpy()).all()
    np.testing.assert_array_equal(delivered.numpy(), [2.0] * 4)


def test_large_tensors_take_the_compiled_pass_and_agree():
    beta, s = 0.9, tf.random.stateless_normal([1 << 17], seed=[1, 2])
    delivered = tf.Variable(tf.random.stateless_normal([1 << 17], seed=[3, 4]))
    expected = (s - beta * delivered) / (1 - beta)
    np.testing.assert_allclose(momentum.hand_over(s, delivered, beta).numpy(), expected.numpy(), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_array_equal(delivered.numpy(), s.numpy())


@pytest.mark.parametrize("make", [lambda **kw: TopKCompressor(ratio=0.05, **kw),
                                  lambda **kw: GradPartCompressor(follow_link=False, **kw)])
def test_a_compressor_hands_over_its_sums_and_keeps_its_error_feedback(make):
    """Beside the same compressor without the hand-over: the same residuals, and each output
    is (s_t - beta s_{t-1}) / (1 - beta) of the other's s_t."""
    plain, handed = make(optimizer_momentum=0.0), make(optimizer_momentum=0.9)
    run = lambda comp: tf.function(lambda g: comp.decompress(*comp.compress(g)))
    plain_step, handed_step = run(plain), run(handed)
    previous = np.zeros([96, 96], np.float32)
    for t in range(5):
        g = tf.random.stateless_normal([96, 96], seed=[t, 7])
        s, d = plain_step(g).numpy(), handed_step(g).numpy()
        np.testing.assert_allclose(d, (s - 0.9 * previous) / 0.1, rtol=1e-4, atol=1e-4)
        previous = s
    for a, b in zip(plain.memory.slots.values(), handed.memory.slots.values()):
        np.testing.assert_array_equal(a.residual.numpy(), b.residual.numpy())
        assert a.delivered is None and b.delivered is not None


class _Probe(tf.keras.optimizers.SGD):
    """An optimizer whose method calls the compressor, as Horovod's DistributedOptimizer does."""

    def exchange(self, comp, g):
        return comp.decompress(*comp.compress(g))


class _AdamProbe(tf.keras.optimizers.Adam):
    exchange = _Probe.exchange


@pytest.mark.parametrize("optimizer, beta", [(_Probe(0.1, momentum=0.9), 0.9), (_Probe(0.1), 0.0),
                                             (_AdamProbe(), 0.0)])
def test_gradpart_reads_the_momentum_of_the_keras_optimizer_that_calls_it(optimizer, beta):
    comp = GradPartCompressor(follow_link=False)
    tf.function(lambda g: optimizer.exchange(comp, g))(tf.random.stateless_normal([64, 64], seed=[0, 1]))
    (slot,) = comp.memory.slots.values()
    assert (slot.delivered is not None) == (beta > 0)


def test_without_an_optimizer_on_the_stack_gradpart_hands_over_nothing_until_told():
    comp = GradPartCompressor(follow_link=False)
    assert momentum.calling_optimizer() == 0.0
    assert momentum.follow(comp, tf.keras.optimizers.SGD(0.1, momentum=0.9)) is comp
    assert comp.optimizer_momentum == 0.9
    topk = momentum.follow(TopKCompressor(), tf.keras.optimizers.SGD(0.1, momentum=0.9))
    assert topk.optimizer_momentum == 0.0  # a method at its published form stays so
    momentum.follow(hvd.Compression.fp16, tf.keras.optimizers.SGD(0.1, momentum=0.9))  # nothing to tell


def tape_step(comp, optimizer=None, other=None):
    """A ``tf.function`` step as users write it with ``hvd.DistributedGradientTape``: the tape's
    gradient through ``comp`` (as the wrapper calls it), then the optimizers it names apply it."""
    w = tf.Variable(tf.random.stateless_normal([64, 64], seed=[0, 1]))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(w ** 3)
        grad = comp.decompress(*comp.compress(tape.gradient(loss, w)))
        if optimizer is not None:
            optimizer.apply_gradients([(grad, w)])
        if other is not None:
            other.apply_gradients([(grad, w)])
    step()
    (slot,) = comp.memory.slots.values()
    return slot


@pytest.mark.parametrize("optimizer, beta", [(tf.keras.optimizers.SGD(0.1, momentum=0.9), 0.9),
                                             (tf.keras.optimizers.legacy.SGD(0.1, momentum=0.5), 0.5),
                                             (tf.keras.optimizers.Adam(), 0.0), (None, 0.0)])
def test_under_a_tape_gradpart_takes_the_momentum_of_the_optimizer_its_step_names(optimizer, beta):
    slot = tape_step(GradPartCompressor(follow_link=False), optimizer)
    assert (slot.delivered is not None) == (beta > 0)


def test_a_step_naming_optimizers_that_disagree_hands_over_nothing_and_says_what_to_set():
    with pytest.warns(UserWarning, match="pass optimizer_momentum"):
        slot = tape_step(GradPartCompressor(follow_link=False), tf.keras.optimizers.SGD(0.1, momentum=0.9),
                         tf.keras.optimizers.Adam())
    assert slot.delivered is None


@pytest.mark.parametrize("optimizer, beta", [
    (tf.keras.optimizers.SGD(0.1, momentum=0.9), 0.9), (tf.keras.optimizers.legacy.SGD(0.1, momentum=0.5), 0.5),
    (tf.keras.optimizers.legacy.SGD(0.1), 0.0), (tf.keras.optimizers.Adam(), 0.0),
    (tf.keras.optimizers.RMSprop(momentum=0.9), 0.0),
    (tf.keras.mixed_precision.LossScaleOptimizer(tf.keras.optimizers.SGD(0.1, momentum=0.8)), 0.8)])
def test_the_momentum_of_sgd_only(optimizer, beta):
    assert momentum.of_optimizer(optimizer) == pytest.approx(beta)


@pytest.mark.parametrize("bad", [1.0, -0.1, "0.9", True])
def test_a_momentum_outside_0_to_1_names_the_argument(bad):
    with pytest.raises(ValueError, match="optimizer_momentum must be None .* in \\[0, 1\\)"):
        GradPartCompressor(optimizer_momentum=bad)
    with pytest.raises(ValueError, match="TopKCompressor: optimizer_momentum"):
        TopKCompressor(optimizer_momentum=bad)


def test_an_elastic_commit_keeps_the_last_sum_and_a_reset_forgets_it():
    comp = TopKCompressor(optimizer_momentum=0.9)
    step = tf.function(lambda g: comp.decompress(*comp.compress(g)))
    step(tf.random.stateless_normal([64, 64], seed=[0, 1]))
    state = CompressorState(comp)
    state.save()
    (slot,) = comp.memory.slots.values()
    committed = slot.delivered.numpy()
    step(tf.random.stateless_normal([64, 64], seed=[0, 2]))
    state.restore()
    np.testing.assert_array_equal(slot.delivered.numpy(), committed)
    state.restart_shared()
    assert not slot.delivered.numpy().any()
