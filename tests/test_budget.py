"""The link budget's controller on hand-made figures (one process, no Horovod exchange)."""
import math
import statistics

import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart import budget as bd

ELEMENTS = 1_000_000  # a 4 MB float32 gradient


def controller(dense=False):
    b = bd.Budget(density_ceiling=0.02)
    b.elements.assign(ELEMENTS)
    b.measured_dense.assign(1.0 if dense else 0.0)
    return b


def feed(b, step_s, link_s, share, marker=1.0, dense=None, offered=None):
    """One step's shared figures, as the reduced marker brings them (``marker`` = 1 for
    Average, N for Sum: the figures come multiplied by it): bytes ``share`` per element at
    ``VALUE_BYTES`` a value, and the values the rule ``offered`` per element (default: those
    sent)."""
    if dense is not None:
        b.measured_dense.assign(1.0 if dense else 0.0)
    density = share / bd.VALUE_BYTES
    offered = density if offered is None else offered
    figures = tf.constant([step_s, link_s, link_s ** 2, share, 1.0, density, offered], tf.float32) * marker
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


def test_a_cheap_dense_step_loses_to_a_sparse_one_that_does_nearly_as_much():
    # LeNet-5 at 100 Mbit/s: a sparse step (26 ms without the link) sends the 2 % ceiling in
    # 1 ms; a dense one takes 8 + 34 ms. At 2 % a step does 0.2 ** g = 0.77 of a dense one's
    # progress (d ** g alone would say 0.53, and dense would win).
    b = bd.Budget(density_ceiling=0.02)
    b.elements.assign(107_000)
    for _ in range(5):
        feed(b, 0.026 + 0.004, 0.004, 0.02 * bd.VALUE_BYTES, dense=False)
    feed(b, 0.008 + 0.034, 0.034, 1.0, dense=True)  # a probe measures 12.5 MB/s
    assert b.bandwidth.numpy() == pytest.approx(4 * 107_000 / 0.034)
    assert b.dense.numpy() == 0.0


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


def test_the_link_time_is_the_last_rank_s_not_the_wait_of_the_first():
    b = controller()
    # rank 0 reached the collective 45 ms early (its peer computed longer): link 50 ms and 5 ms
    links = tf.constant([0.05, 0.005], tf.float64)
    figures = tf.stack([0.07, tf.reduce_mean(links), tf.reduce_mean(links ** 2), 0.001, 1.0,  # 1 KB sent
                        0.001 / bd.VALUE_BYTES, 0.001 / bd.VALUE_BYTES])
    b.update(tf.cast(figures, tf.float32), tf.constant(1.0, tf.float32))
    assert b.bandwidth.numpy() == pytest.approx(0.001 * ELEMENTS / 0.005, rel=1e-3)
    assert b.other_s.numpy() == pytest.approx(0.065, rel=1e-3)  # the wait is the step's, not the link's


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


def test_the_fitted_line_tells_a_payload_from_the_fixed_cost():
    b = controller()
    shares = [0.0005, 0.001, 0.002, 0.0015, 0.003]  # the entropy rule's counts vary step to step
    for i in range(20):  # 100 Mbit/s, 5 ms fixed: 2-11 KB payloads take 0.1-0.8 ms of their own
        feed(b, *sparse_step_figures(bandwidth=1.25e7, share=shares[i % 5], fixed_s=0.005), dense=False)
    fixed, fitted = (x.numpy() for x in b.line())
    assert fixed == pytest.approx(0.005, rel=0.05)
    assert b.bandwidth.numpy() == pytest.approx(1.25e7, rel=0.05)  # payload / link time: about 1.3e6
    steps = 0
    while b.bandwidth.numpy() > 2.5e6:  # the link drops to 10 Mbit/s
        feed(b, *sparse_step_figures(bandwidth=1.25e6, share=shares[steps % 5], fixed_s=0.005), dense=False)
        steps += 1
        assert steps <= 15, "the fit did not follow the slower link"  # it fades over about 10 steps
    for i in range(20):
        feed(b, *sparse_step_figures(bandwidth=1.25e6, share=shares[i % 5], fixed_s=0.005), dense=False)
    assert b.bandwidth.numpy() == pytest.approx(1.25e6, rel=0.1)


def test_payloads_of_one_size_give_no_fit_only_a_lower_bound():
    b = controller()
    for _ in range(20):
        feed(b, *sparse_step_figures(bandwidth=1.25e7, share=0.001, fixed_s=0.005), dense=False)
    assert b.line()[1].numpy() == 0.0
    sent = 0.001 * ELEMENTS * bd.VALUE_BYTES
    assert b.bandwidth.numpy() == pytest.approx(sent / (0.005 + sent / 1.25e7), rel=1e-3)  # float32 figures


def test_payloads_of_one_size_on_a_link_that_slows_lower_the_bandwidth():
    b = controller()
    for _ in range(10):  # 35 KB: 2.8 ms of its own beside a 5 ms fixed cost at 100 Mbit/s
        feed(b, *sparse_step_figures(bandwidth=1.25e7, share=0.01, fixed_s=0.005), dense=False)
    assert b.bandwidth.numpy() == pytest.approx(3.5e4 / 0.0078, rel=1e-3)  # the lower bound: nothing fits
    for _ in range(10):  # 10 Mbit/s: the payload's 28 ms dwarf the least link time seen
        feed(b, *sparse_step_figures(bandwidth=1.25e6, share=0.01, fixed_s=0.005), dense=False)
    assert 1.25e6 <= b.bandwidth.numpy() < 1.6e6


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


def closed_loop(n, steps, bandwidth, per_value_s=0.0, seed=0):
    """The controller driving a stand-in for the entropy rule under error feedback (Laplace
    gradients, threshold exp(h) (log n + price), the compressor's floor and ceiling guards) on a
    link of 4 ms fixed cost and ``bandwidth(step)``; a step computes 20 ms, and ``per_value_s``
    more per value it sends (selection and coding). Returns the controller, the step times and the
    values the rule offered each step."""
    rng = np.random.default_rng(seed)
    b = bd.Budget(density_ceiling=0.02)
    b.elements.assign(n)
    residual, times, offers = np.zeros(n, np.float32), [], []
    for step in range(steps):
        acc = residual + rng.laplace(0.0, 1.0, n).astype(np.float32)
        tau = 2 * math.e * max(math.log(n) + float(b.price.numpy()), 0.0)
        offered = int((np.abs(acc) > tau).sum())
        k = int(np.clip(offered, math.ceil(1e-4 * n), 0.02 * n))
        sent = np.argpartition(-np.abs(acc), k)[:k]
        residual = acc.copy()
        residual[sent] = 0.0
        link = 0.004 + k * bd.VALUE_BYTES / bandwidth(step) + rng.normal(0.0, 5e-4)
        other_s = 0.02 + per_value_s * k
        feed(b, other_s + link, link, k * bd.VALUE_BYTES / n, dense=False, offered=offered / n)
        times.append(other_s + link)
        offers.append(offered)
    return b, times, offers


def test_in_a_closed_loop_the_step_time_comes_back_after_the_link_drops():
    b, times, _ = closed_loop(200_000, 200, lambda step: 1.25e7 if step < 100 else 1.25e6)
    before, after = statistics.median(times[80:100]), statistics.median(times[140:160])
    assert after <= 1.5 * before, (before, after)
    assert b.bandwidth.numpy() < 2.5e6


def test_a_selection_that_costs_time_per_value_does_not_buy_itself_more_bytes():
    # 2 us a value: the 2 % ceiling would add 40 ms to a 20 ms step, and a target priced on that
    # step's time would be over the ceiling's bytes, so the price would run to its bound
    b, times, _ = closed_loop(1_000_000, 80, lambda step: 1.25e7, per_value_s=2e-6)
    assert b.price.numpy() > -bd.PRICE_LIMIT / 2
    assert statistics.median(times[60:]) < 0.045


def test_a_link_that_wants_more_than_the_ceiling_does_not_wind_the_price_down():
    # 10 GB/s: the target is far over the 2 % ceiling; a price that answered the bytes sent
    # (capped) ran to its bound, where every nonzero element is a candidate
    b, _, offers = closed_loop(200_000, 120, lambda step: 1e10)
    assert b.price.numpy() > -bd.PRICE_LIMIT + 5
    assert statistics.median(offers[60:]) < 3 * 0.02 * 200_000


def pipelined(b, steps, sparse, dense):
    """Runs ``steps`` steps as the compressor does: each step's update folds in the figures of
    the step before it (``sparse`` or ``dense``, by that step's mode) and decides the mode of
    the step after it. Returns the modes of the steps run."""
    modes, before, running = [], None, 0.0
    for _ in range(steps):
        b.step_dense.assign(running)
        if before is not None:
            feed(b, *(dense if before else sparse), dense=bool(before))
        modes.append(running)
        before, running = running, float(b.dense.numpy())
    return modes


def test_the_first_probe_is_one_dense_step_though_its_figures_come_a_step_late():
    # payloads that are mostly fixed cost call the probe at once; the dense step then measures
    # 4 MB in 100 ms, too slow to stay dense, and the next step's update has not seen it yet
    b = controller()
    modes = pipelined(b, 12, sparse_step_figures(bandwidth=1e9), (0.02 + 0.1, 0.1, 1.0))
    assert modes.count(1.0) == 1 and modes.index(1.0) <= 3, modes
    assert b.bandwidth.numpy() <= 4e6 / 0.1 * 1.0001


def test_the_next_probe_is_priced_at_the_last_dense_step_s_measure():
    b = controller()
    feed(b, 0.02 + 0.33, 0.33, 1.0, dense=True)  # a probe: 4 MB in 0.33 s, 12 MB/s
    b.bandwidth.assign(3.6e7)  # as the payloads' fitted line read it (3x the link)
    for i in range(150):
        feed(b, *sparse_step_figures(bandwidth=3.6e7, share=0.002), dense=False)  # 7 KB
        assert b.dense.numpy() == 0.0, i  # 150 steps of 22 ms are under 20 probes of 0.35 s


def test_a_dense_step_is_priced_at_what_a_dense_step_measured():
    # an unshaped link: dense steps measure 1 GB/s; the sparse steps between them, a few KB
    # each, have link times that grow with their bytes as if the link carried 4 MB/s
    b = controller()
    feed(b, 0.02 + 4e6 / 1e9, 4e6 / 1e9, 1.0, dense=True)
    assert b.dense.numpy() == 1.0
    shares = [0.0005, 0.001, 0.002, 0.0015, 0.003]
    for i in range(30):
        share = shares[i % 5]
        feed(b, *sparse_step_figures(bandwidth=4e6, share=share / bd.VALUE_BYTES), dense=False)
    assert b.dense.numpy() == 1.0
