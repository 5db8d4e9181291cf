"""The link budget's controller on hand-made figures (one process, no Horovod exchange)."""
import math

import pytest
import tensorflow as tf

from hvd_gradpart import budget as bd

ELEMENTS = 1_000_000  # a 4 MB float32 gradient


def controller(dense=False):
    b = bd.Budget(density_ceiling=0.02)
    b.elements.assign(ELEMENTS)
    b.measured_dense.assign(1.0 if dense else 0.0)
    return b


def feed(b, step_s, link_s, share, marker=1.0, dense=None):
    """One step's shared figures, as the reduced marker brings them (``marker`` = 1 for
    Average, N for Sum: the figures come multiplied by it)."""
    if dense is not None:
        b.measured_dense.assign(1.0 if dense else 0.0)
    figures = tf.constant([step_s, link_s, share, 1.0], tf.float32) * marker
    b.update(figures, tf.constant(marker, tf.float32))


def sparse_step_figures(bandwidth, other_s=0.02, share=0.02, fixed_s=0.002):
    link = fixed_s + share * ELEMENTS * bd.VALUE_BYTES / bandwidth
    return other_s + link, link, share * bd.VALUE_BYTES  # the figure: bytes sent per element


def test_the_time_optimal_link_share_is_g_over_one_minus_g():
    # progress per second d**g / (T + L) with L proportional to d peaks at L = g / (1 - g) T
    g, T = bd.EXPONENT, 0.02
    rate = lambda L: L ** g / (T + L)
    best = max((rate(T * x / 1000), T * x / 1000) for x in range(1, 5000))[1]
    assert best == pytest.approx(g / (1 - g) * T, rel=1e-2)


def test_a_slow_link_stays_sparse_and_the_price_buys_the_target_bytes():
    b = controller()
    for _ in range(30):
        feed(b, *sparse_step_figures(bandwidth=1.25e6))  # 10 Mbit/s: 70 KB take 56 ms
    assert b.dense.numpy() == 0.0
    # 2 % sends 70 KB; the target is g / (1 - g) * 20 ms of 1.25 MB/s, 4.8 KB: the price rises
    assert b.price.numpy() > -bd.PRICE_LIMIT + 1.0


def test_a_fast_link_goes_dense_after_its_probe():
    b = controller()
    dense = []
    for _ in range(40):
        if b.dense.numpy() > 0.5:  # the dense exchange of 4 MB at 1 GB/s
            feed(b, 0.02 + 0.004, 0.004, 1.0, dense=True)
        else:  # sparse steps on a fast link see mostly fixed cost: they say little of the link
            feed(b, *sparse_step_figures(bandwidth=1e9), dense=False)
        dense.append(b.dense.numpy())
    assert dense.index(1.0) <= 2  # the first probe comes at once
    assert all(d == 1.0 for d in dense[5:])
    assert b.bandwidth.numpy() == pytest.approx(4e6 / 0.004)


def test_a_slow_link_is_probed_only_on_schedule():
    b = controller()
    for _ in range(20):  # 10 Mbit/s: the payload's link time dwarfs the step's other time
        feed(b, *sparse_step_figures(bandwidth=1.25e6), dense=False)
        assert b.dense.numpy() == 0.0


def test_a_dense_link_that_slows_goes_back_to_sparse():
    b = controller(dense=True)
    feed(b, 0.024, 0.004, 1.0, dense=True)
    assert b.dense.numpy() == 1.0
    feed(b, 0.02 + 3.2, 3.2, 1.0, dense=True)  # 4 MB now take 3.2 s (10 Mbit/s)
    assert b.dense.numpy() == 0.0


def test_sum_and_average_give_the_same_decisions():
    runs = []
    for marker in (1.0, 2.0):
        b = controller()
        for _ in range(5):
            feed(b, *sparse_step_figures(bandwidth=1.25e7), marker=marker)
        runs.append((b.price.numpy(), b.other_s.numpy(), b.bandwidth.numpy(), b.dense.numpy()))
    assert runs[0] == pytest.approx(runs[1])


def test_a_probe_costs_at_most_its_share_of_the_sparse_time():
    b = controller()
    feed(b, 0.22, 0.2, 0.12, dense=False)  # 0.12 bytes per element, 120 KB in 0.2 s: 0.6 MB/s
    b.bandwidth.assign(1.25e6)  # a dense step measured at 10 Mbit/s: 3.2 s for 4 MB
    steps = 0
    while b.dense.numpy() == 0.0:
        feed(b, 0.22, 0.2, 0.12, dense=False)
        steps += 1
    dense_step = 0.02 + 4e6 / 1.25e6
    assert steps * 0.22 == pytest.approx(dense_step / bd.PROBE_SHARE, rel=0.05)
    assert b.since_dense_s.numpy() == 0.0


def test_a_link_that_slows_under_sparse_steps_lowers_the_bandwidth():
    b = controller()
    for _ in range(10):
        feed(b, *sparse_step_figures(bandwidth=1.25e7), dense=False)
    assert b.bandwidth.numpy() == pytest.approx(1.25e7, rel=0.3)
    assert b.fixed_s.numpy() < 0.015  # 100 Mbit/s: a 2 ms fixed cost and a 5.6 ms payload
    for _ in range(3):
        feed(b, *sparse_step_figures(bandwidth=1.25e6), dense=False)  # 10 Mbit/s now
    assert b.bandwidth.numpy() == pytest.approx(1.25e6, rel=0.2)


def test_the_price_never_makes_the_rule_sparser():
    b = controller()
    for _ in range(300):
        feed(b, *sparse_step_figures(bandwidth=1e4))  # a link so slow the target is a few bytes
    assert b.price.numpy() == 0.0


def test_an_evaluation_pause_does_not_swing_the_non_link_time():
    b = controller()
    for _ in range(10):
        feed(b, 0.03, 0.01, 0.02)
    before = b.other_s.numpy()
    feed(b, 5.0, 0.01, 0.02)  # rank 0 evaluated between two steps
    assert b.other_s.numpy() < 2 * before
    assert math.isfinite(b.price.numpy())
