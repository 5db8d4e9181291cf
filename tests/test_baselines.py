"""Baseline selection rules (variance, DGC, SIDCo) against hand-computed cases, in one process.

With one process Horovod's allgather is the identity, so ``decompress(*compress(g))``
returns exactly what this rank sent.
"""
import math

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart.compressors import DGCCompressor, SIDCoCompressor, VarianceCompressor, get_compressor
from hvd_gradpart.memory import Memory

hvd.init()


def send(comp, g):
    """One step: what was sent, and the slot afterwards."""
    out = comp.decompress(*comp.compress(tf.constant(g, tf.float32))).numpy()
    return out, next(iter(comp.memory.slots.values()))


def selected(comp, acc, slot=None):
    """``comp.select`` of a slot (fresh by default, so the accumulated value is ``acc``),
    as a sorted index list; nothing is stored."""
    acc = tf.constant(acc)
    slot = slot or Memory().slot(acc, comp.state_spec())
    view = comp.slot_view(slot, acc)
    return sorted(comp.select(comp.run_sweep(view, acc), acc, view)[0].numpy().tolist())


# Variance-based compression --------------------------------------------------

def test_variance_drop_in_mode_matches_the_equations_over_three_steps():
    comp = VarianceCompressor(alpha=2.0, zeta=0.5, moment_decay=0.5, min_elements=0)
    # Element 0 by hand: step 1 s = 0, r = 1 sent. Step 2: EMAs -0.25 and 0.75 over 0.75 give
    # s = 1 - 1/9 = 8/9; r**2 = 1 < 2 * 8/9 so kept, v = 8/9 * 0.5 = 4/9. Step 3: s = 3/7 - 1/49 = 20/49,
    # v = 4/9 + 20/49, 1 < 2 v: kept, v = (4/9 + 20/49) / 2.
    grads = [[1.0, 2.0, 0.0, -1.0], [-1.0, 2.0, 0.0, 3.0], [0.0, 2.5, 0.0, 3.0]]
    mean, square, v, r = (np.zeros(4) for _ in range(4))
    for t, g in enumerate(np.array(grads), 1):
        mean, square = 0.5 * mean + 0.5 * g, 0.5 * square + 0.5 * g * g
        s = np.maximum(square / (1 - 0.5 ** t) - (mean / (1 - 0.5 ** t)) ** 2, 0)
        r, v = r + g, v + s
        mask = r * r > 2.0 * v
        out, slot = send(comp, g)
        np.testing.assert_allclose(out, np.where(mask, r, 0), rtol=1e-6)
        r, v = np.where(mask, 0, r), np.where(mask, 0, 0.5 * v)
        np.testing.assert_allclose(slot.residual.numpy(), r, rtol=1e-6)
        np.testing.assert_allclose(slot.state["v"].numpy(), v, rtol=1e-6, atol=1e-7)
        if t == 1:
            assert mask.tolist() == [True, True, False, True]  # no variance known yet: nonzeros go
    assert np.isclose(v[0], (4 / 9 + 20 / 49) / 2) and r[0] == -1.0


def per_example_grads_by_hand(w, x, y):
    """Gradients of 0.5 * (x_b . w - y_b)**2 for each example b, in numpy."""
    return np.stack([(xb @ w - yb) * xb for xb, yb in zip(x, y)])


def test_variance_faithful_mode_uses_the_per_example_variance_of_the_mean():
    rs = np.random.RandomState(3)
    w0, xs, ys = rs.randn(6), rs.randn(2, 5, 6), rs.randn(2, 5)
    w = tf.Variable(w0.astype(np.float32))
    comp = VarianceCompressor(alpha=1.0, zeta=0.5, variance="microbatches", min_elements=0)

    def loss(x, y):
        return tf.reduce_mean(0.5 * tf.square(tf.linalg.matvec(x, w) - y))

    @tf.function
    def step(x, y):
        per_example = []
        for b in range(5):
            with tf.GradientTape() as tape:
                example = loss(x[b:b + 1], y[b:b + 1])
            per_example.append(tape.gradient(example, [w]))
        comp.observe_microbatches(per_example)
        with tf.GradientTape() as tape:
            total = loss(x, y)
        return comp.decompress(*comp.compress(tape.gradient(total, w)))

    v = np.zeros(6)
    for t in range(2):  # the second step checks the variance is refreshed, not a stale capture
        per_example = per_example_grads_by_hand(w0, xs[t], ys[t])
        g = per_example.mean(0)
        s = np.var(per_example, axis=0, ddof=1) / 5
        out = step(tf.constant(xs[t], tf.float32), tf.constant(ys[t], tf.float32)).numpy()
        np.testing.assert_allclose(comp.observed[0].numpy(), s, rtol=1e-5)
        residual = next(iter(comp.memory.slots.values())).residual.numpy()
        r = residual + out  # what was accumulated this step
        v = v + s
        mask = r * r > v
        np.testing.assert_allclose(out, np.where(mask, r, 0), rtol=1e-5)
        v = np.where(mask, 0, 0.5 * v)
        np.testing.assert_allclose(next(iter(comp.memory.slots.values())).state["v"].numpy(), v, rtol=1e-5)
        if t == 0:
            np.testing.assert_allclose(r, g, rtol=1e-5)
            assert 0 < mask.sum() < 6


def test_variance_faithful_mode_needs_observed_variances_in_order():
    comp = VarianceCompressor(variance="microbatches", min_elements=0)
    with pytest.raises(ValueError, match="observe_microbatches"):
        comp.compress(tf.ones([4]))
    comp.observe_microbatches([[tf.ones([3])], [tf.zeros([3])]])
    with pytest.raises(ValueError, match="order Horovod receives them"):
        comp.compress(tf.ones([4]))
    with pytest.raises(ValueError, match=">= 2 gradient lists"):
        comp.observe_microbatches([[tf.ones([3])]])


# Deep Gradient Compression ---------------------------------------------------

def test_dgc_momentum_correction_and_masking_over_three_steps():
    comp = DGCCompressor(density=0.25, momentum=0.5, warmup_steps=0, sample_ratio=1.0, min_elements=0)
    # u = 0.5 u + g; v = v + u; send top-1 of |v|; zero u and v where sent.
    steps = [([1.0, -2.0, 0.5, 0.25], [0, -2.0, 0, 0], [1.0, 0, 0.5, 0.25], [1.0, 0, 0.5, 0.25]),
             ([1.0, 1.0, 1.0, 1.0], [2.5, 0, 0, 0], [0, 1.0, 1.25, 1.125], [0, 1.0, 1.75, 1.375]),
             ([0.0, 0.0, 0.0, -4.0], [0, 0, 2.375, 0], [0, 0.5, 0, -3.4375], [0, 1.5, 0, -2.0625])]
    for g, sent, u, v in steps:
        out, slot = send(comp, g)
        np.testing.assert_array_equal(out, sent)
        np.testing.assert_array_equal(slot.state["u"].numpy(), u)
        np.testing.assert_array_equal(slot.residual.numpy(), v)


def test_dgc_warmup_schedule_is_exact():
    comp = DGCCompressor(warmup_steps=3, momentum=0.0, sample_ratio=1.0, min_elements=0)
    want = [0.25] * 3 + [0.0625] * 3 + [0.015625] * 3 + [0.004] * 3 + [0.001] * 4
    assert [float(comp.density_at(tf.constant(s, tf.int64))) for s in range(16)] == want
    rs = np.random.RandomState(0)
    counts = []
    for _ in range(16):
        _, slot = send(comp, rs.randn(1000))
        counts.append(int(slot.metrics.read()["sent_elements"]))
    assert counts == [250] * 3 + [63] * 3 + [16] * 3 + [4] * 3 + [1] * 4
    assert float(DGCCompressor(warmup_steps=0).density_at(tf.constant(0, tf.int64))) == 0.001


def with_sample(sample_values):
    """1..100 with ``sample_values`` at the sampled positions 0, 10, ..., 90, the rest in order."""
    values = np.zeros(100, np.float32)
    values[::10] = sample_values
    values[values == 0] = np.setdiff1d(np.arange(1, 101), sample_values)
    return values


def test_dgc_sampled_threshold_and_exact_topk_fallback():
    comp = DGCCompressor(density=0.1, warmup_steps=0, sample_ratio=0.1)  # 10 samples a[offset::10]; k = 10
    values = np.arange(1, 101, dtype=np.float32)
    assert selected(comp, values) == list(range(90, 100))  # sample max 91: exactly the 10 largest pass
    low = with_sample(np.arange(1, 11))  # threshold 10: 91 pass, exact top-k keeps the 10 largest
    assert selected(comp, low) == sorted(np.argsort(-low)[:10].tolist())
    high = with_sample(np.arange(91, 101))  # threshold 100: only the largest passes (fewer than k)
    assert selected(comp, high) == [90]
    slot = Memory().slot(tf.constant(high), comp.state_spec())
    selected(comp, high, slot)
    assert len(selected(comp, high, slot)) == 10  # next step samples a[1::10]: threshold 82


def test_dgc_local_clipping_scales_by_rank_count():
    comp = DGCCompressor(clip_norm=2.0, momentum=0.0, min_elements=0)
    out, slot = send(comp, [3.0, 4.0])  # sent plus kept is the clipped gradient
    np.testing.assert_allclose(out + slot.residual.numpy(), np.array([3.0, 4.0]) * 2.0 / math.sqrt(hvd.size()) / 5.0,
                               rtol=1e-6)
    assert np.count_nonzero(out) == 1


# SIDCo -----------------------------------------------------------------------

def test_sidco_exponential_threshold_single_and_two_stage():
    acc = np.arange(1, 1001, dtype=np.float64) / 500 * (-1) ** np.arange(1000)  # mean |a| = 1.001
    # One stage: eta = 1.5 * 1.001 = 1.5015, so |a| = (i + 1) / 500 passes from i + 1 = 751.
    assert selected(SIDCoCompressor(delta=math.exp(-1.5), stages=1), acc) == list(range(750, 1000))
    # Two stages of e^-1.5: exceedances (751..1000) / 500 - 1.5015 have mean 0.2495, so
    # eta = 1.5015 + 1.5 * 0.2495 = 1.87575, passing from i + 1 = 938.
    assert selected(SIDCoCompressor(delta=math.exp(-3.0), stages=2), acc) == list(range(937, 1000))


@pytest.mark.parametrize("family, sample", [
    ("exponential", lambda rs, n: rs.laplace(size=n)),
    ("gamma", lambda rs, n: rs.gamma(0.5, size=n) * rs.choice([-1, 1], n)),
    ("gpareto", lambda rs, n: rs.pareto(4.0, size=n)),
])
@pytest.mark.parametrize("stages", [1, 2, 3])
def test_sidco_hits_the_target_density_on_its_own_family(family, sample, stages):
    n = 200_000
    count = len(selected(SIDCoCompressor(delta=0.001, stages=stages, family=family),
                         sample(np.random.RandomState(stages), n)))
    assert 0.75 * 0.001 * n < count < 1.25 * 0.001 * n


def test_sidco_ignores_zeros_and_survives_degenerate_input():
    assert selected(SIDCoCompressor(stages=3, family="gamma"), np.zeros(2048, np.float32)) == []
    assert selected(SIDCoCompressor(stages=2, family="gpareto"), np.ones(2048, np.float32)) == []
    out, slot = send(SIDCoCompressor(family="gamma"), np.zeros(4096))
    assert not out.any() and not slot.residual.numpy().any()


# Configuration ---------------------------------------------------------------

@pytest.mark.parametrize("make, argument", [
    (lambda: VarianceCompressor(alpha=0), "alpha"), (lambda: VarianceCompressor(zeta=0), "zeta"),
    (lambda: VarianceCompressor(zeta=1.5), "zeta"),
    (lambda: VarianceCompressor(variance="batch"), "variance"),
    (lambda: VarianceCompressor(moment_decay=1.0), "moment_decay"),
    (lambda: DGCCompressor(density=0), "density"), (lambda: DGCCompressor(momentum=1.0), "momentum"),
    (lambda: DGCCompressor(clip_norm=0), "clip_norm"),
    (lambda: DGCCompressor(warmup_steps=-1), "warmup_steps"),
    (lambda: DGCCompressor(warmup_densities=(0.5, 2.0)), "warmup_densities"),
    (lambda: DGCCompressor(sample_ratio=0), "sample_ratio"),
    (lambda: SIDCoCompressor(delta=1.0), "delta"), (lambda: SIDCoCompressor(stages=0), "stages"),
    (lambda: SIDCoCompressor(family="normal"), "family"),
])
def test_bad_hyperparameters_name_the_argument_and_range(make, argument):
    with pytest.raises(ValueError, match=rf"{argument} must be .*, got"):
        make()


@pytest.mark.parametrize("name, cls", [("variance", VarianceCompressor), ("dgc", DGCCompressor),
                                       ("sidco", SIDCoCompressor)])
def test_registered_and_usable_as_class_or_instance(name, cls):
    assert isinstance(get_compressor(name), cls)
    g = tf.constant(np.random.RandomState(1).laplace(size=4096).astype(np.float32))
    out, ctx = cls.compress(g)  # the class itself, as compression=cls passes it
    assert ctx is not None and cls.decompress(out, ctx).shape == g.shape
