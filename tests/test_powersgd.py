"""PowerSGD in one process: hand-computed cases and invariants.

With one process Horovod's allreduce is the identity, so ``decompress(*compress(g))``
returns this rank's own rank-r approximation ``P P^T M`` (in the module doc's terms).
"""
import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart import PowerSGDCompressor, get_compressor, snapshot, summary

hvd.init()


def step(comp, g):
    """One step eagerly: the output and the (only) slot afterwards."""
    out = comp.decompress(*comp.compress(tf.constant(g))).numpy()
    return out, next(iter(comp.memory.slots.values()))


def low_rank(shape, r, seed=0):
    """A random tensor whose matrix view ``reshape(-1, shape[-1])`` has rank ``r``."""
    rs = np.random.RandomState(seed)
    fan_in = int(np.prod(shape[:-1]))
    return (rs.randn(fan_in, r) @ rs.randn(r, shape[-1])).reshape(shape).astype(np.float32)


@pytest.mark.parametrize("shape, r", [((40, 30), 2), ((5, 5, 6, 16), 1), ((784, 64), 3)])
def test_a_rank_r_input_is_reproduced_after_a_warm_started_step(shape, r):
    comp = PowerSGDCompressor(rank=r, warmup_steps=0, min_elements=0)
    g = low_rank(shape, r)
    scale = np.abs(g).max()
    for _ in range(2):  # the first step starts from the random Q, the second from the kept one
        out, slot = step(comp, g)
        np.testing.assert_allclose(out, g, atol=2e-6 * scale)
        np.testing.assert_allclose(slot.residual.numpy(), 0, atol=2e-6 * scale)
    assert slot.state["step"].numpy() == 2


def test_the_kept_q_is_one_power_iteration_step():
    # Rank one, M^T = u v^T: P = M Q is along v, so P = +-v/|v| and the kept Q = M^T P = +-u |v|.
    rs = np.random.RandomState(2)
    u, v = rs.randn(50), rs.randn(20)
    comp = PowerSGDCompressor(warmup_steps=0, min_elements=0)
    _, slot = step(comp, np.outer(u, v).astype(np.float32))
    q = slot.state["q"].numpy()[:, 0]
    np.testing.assert_allclose(np.abs(q), np.abs(u) * np.linalg.norm(v), rtol=1e-5)
    assert abs(np.dot(q, u)) == pytest.approx(np.linalg.norm(u) ** 2 * np.linalg.norm(v), rel=1e-5)


def test_output_plus_residual_is_the_input_every_step():
    comp = PowerSGDCompressor(rank=2, warmup_steps=1, min_elements=0)
    run = tf.function(lambda g: comp.decompress(*comp.compress(g)))
    rs = np.random.RandomState(3)
    residual, sent, given = np.zeros(64 * 48, np.float32), 0.0, 0.0
    for _ in range(5):
        g = rs.randn(64, 48).astype(np.float32)
        out = run(tf.constant(g)).numpy()
        slot = next(iter(comp.memory.slots.values()))
        np.testing.assert_allclose(out.ravel() + slot.residual.numpy(), g.ravel() + residual, atol=1e-5)
        residual, sent, given = slot.residual.numpy(), sent + out, given + g
    assert np.abs(residual).max() > 1.0  # rank 2 of a random 64x48 matrix leaves most of it behind
    np.testing.assert_allclose(sent.ravel() + residual, given.ravel(), atol=1e-4)


def test_warmup_steps_go_dense_then_low_rank():
    comp = PowerSGDCompressor(warmup_steps=2, min_elements=0)
    g = np.random.RandomState(4).randn(32, 64).astype(np.float32)
    for _ in range(2):
        out, slot = step(comp, g)
        np.testing.assert_array_equal(out, g)
        np.testing.assert_array_equal(slot.residual.numpy(), 0)
        assert slot.metrics.read()["sent_bytes"] == 32 * 64 * 4 + 4
    out, slot = step(comp, g)
    assert not np.allclose(out, g)
    assert slot.metrics.read()["sent_bytes"] == (32 + 64) * 4 + 4  # P, Q and the marker


def test_which_tensors_are_compressed_and_what_is_counted():
    comp = PowerSGDCompressor(warmup_steps=0)
    kernel = tf.ones([5, 5, 6, 16])  # Keras HWIO: viewed as 150 x 16
    marker, ctx = comp.compress(kernel)
    assert marker.shape == (1,) and ctx is not None
    for dense in (tf.ones([4096]), tf.ones([4096, 1]), tf.ones([1, 1, 1, 2048])):  # vector; rate below 2
        out, ctx = comp.compress(dense)
        assert out is dense and ctx is None
    assert PowerSGDCompressor(min_elements=0).compress(tf.ones([3, 3]))[1] is None  # 9 against 2 * 6
    wide = tf.ones([2048], tf.float64)  # dense, but not the marker's dtype: its own allreduce
    np.testing.assert_array_equal(comp.decompress(*comp.compress(wide)).numpy(), wide.numpy())
    counts = snapshot(comp)
    assert counts["eager/float32/5x5x6x16"]["sent_bytes"] == (150 + 16) * 4 + 4
    assert counts["eager/float32/4096"]["sent_bytes"] == 4096 * 4
    assert counts["eager/float64/2048"]["sent_bytes"] == 2048 * 8 + 4
    total = summary(comp)
    assert total["last_dense_bytes"] == 2400 * 4 + 4096 * 4 * 2 + 2048 * 4 + 2048 * 8
    assert total["last_sent_bytes"] == 668 + 4096 * 4 * 2 + 2048 * 4 + 2048 * 8 + 4


def test_the_marker_carries_the_reduction():
    g = tf.constant(low_rank((64, 32), 1, seed=5))
    for kwargs, factor in [(dict(op=hvd.Average), 1.0), (dict(op=hvd.Sum, postscale_factor=3.0), 3.0),
                           (dict(op=hvd.Sum, prescale_factor=0.5), 0.5)]:
        comp = PowerSGDCompressor(warmup_steps=0)
        out = tf.function(lambda t: hvd.allreduce(t, compression=comp, **kwargs))(g)
        np.testing.assert_allclose(out.numpy(), factor * g.numpy(), rtol=1e-4, atol=1e-5)


def test_half_precision_is_computed_in_float32_and_returned_in_its_dtype():
    comp = PowerSGDCompressor(warmup_steps=0)
    g = low_rank((64, 32), 1, seed=6)
    out, slot = step(comp, g.astype(np.float16))
    assert out.dtype == np.float16 and slot.state["q"].dtype == tf.float32
    np.testing.assert_allclose(out, g, rtol=1e-2, atol=1e-2)


def test_state_survives_a_checkpoint(tmp_path):
    g = [np.random.RandomState(s).randn(64, 32).astype(np.float32) for s in range(2)]
    first = PowerSGDCompressor(warmup_steps=0)
    step(first, g[0])
    path = tf.train.Checkpoint(compressor=first).save(str(tmp_path / "c"))
    second = PowerSGDCompressor(warmup_steps=0)
    tf.train.Checkpoint(compressor=second).restore(path)
    np.testing.assert_array_equal(step(second, g[1])[0], step(first, g[1])[0])


def test_class_default_instance_and_registry():
    g = tf.constant(low_rank((64, 32), 1))
    out, ctx = PowerSGDCompressor.compress(g)  # the class itself, as compression=PowerSGDCompressor passes it
    assert PowerSGDCompressor.decompress(out, ctx).shape == g.shape
    assert PowerSGDCompressor.instance().memory.slots
    comp = get_compressor("powersgd", rank=4, warmup_steps=10)
    assert isinstance(comp, PowerSGDCompressor) and (comp.rank, comp.warmup_steps) == (4, 10)
    assert comp.settings()["rank"] == 4


@pytest.mark.parametrize("warmup_steps", [0, 5])
def test_nan_gives_a_sum_not_finite_and_keeps_the_state(warmup_steps):
    comp = PowerSGDCompressor(warmup_steps=warmup_steps)
    run = tf.function(lambda t: comp.decompress(*comp.compress(t)))
    good = low_rank((64, 32), 2)
    run(tf.constant(good))
    slot = next(iter(comp.memory.slots.values()))
    kept = [v.numpy().copy() for v in (slot.residual, slot.state["q"], slot.state["step"])]
    bad = good.copy()
    bad[3, 7] = np.nan
    assert not np.isfinite(run(tf.constant(bad)).numpy()).all()
    for before, v in zip(kept, (slot.residual, slot.state["q"], slot.state["step"])):
        np.testing.assert_array_equal(v.numpy(), before)
    assert np.isfinite(run(tf.constant(good)).numpy()).all()


@pytest.mark.parametrize("kwargs, argument", [
    (dict(rank=0), "rank"), (dict(rank=1.5), "rank"), (dict(rank=True), "rank"),
    (dict(warmup_steps=-1), "warmup_steps"), (dict(warmup_steps=2.5), "warmup_steps"),
    (dict(min_compression_rate=0.5), "min_compression_rate"),
    (dict(min_compression_rate=float("inf")), "min_compression_rate"),
    (dict(min_compression_rate="2"), "min_compression_rate"), (dict(seed=None), "seed"),
    (dict(min_elements=-1), "min_elements"),
])
def test_bad_hyperparameters_name_the_argument_and_range(kwargs, argument):
    with pytest.raises(ValueError, match=rf"{argument} must be .*, got"):
        PowerSGDCompressor(**kwargs)
