"""The link budget's controller on hand-made figures (pure Python, no TensorFlow graph)."""
import math
import statistics

import numpy as np
import pytest

from hvd_gradpart.budget import DEFAULT, Budget, clock, controller
from hvd_gradpart.budget.bandwidth import step_value_s, value_s

VALUE_BYTES = 3.3  # bytes a sent value costs on the wire at 0.3-3 %, all counted


class Feeder:
    """Hands the controller one step's shared figures at a time, as every rank folds them."""

    def __init__(self, elements=1_000_000):
        self.state, self.step, self.elements = controller.State(), 0, elements

    def __call__(self, step_s, link_s, values=0.0, dense=False, offered=None, compress_s=0.0):
        capped = (values if offered is None else offered) / values if values else 1.0
        self.step += 1
        self.state = controller.update(self.state, {
            "step_id": self.step, "step_s": step_s, "link_s": link_s, "compress_s": compress_s,
            "dense": 1.0 if dense else 0.0,
            "sent_bytes": values * VALUE_BYTES, "values": values, "capped": capped,
            "elements": self.elements}, DEFAULT)
        return self.state


def sparse_step(bandwidth, values, other_s=0.02, fixed_s=0.004):
    """``(step_s, link_s)`` of a sparse step sending ``values`` on a link of ``bandwidth`` B/s."""
    link = fixed_s + values * VALUE_BYTES / bandwidth
    return other_s + link, link


def test_the_state_round_trips_through_its_vector():
    state = controller.State(price=-3.5, sparse_s=0.04, fit=[1.0, 2.0, 3.0, 4.0, 5.0], work_fit=[6.0, 7.0, 8.0, 9.0, 10.0])
    assert controller.State.of(state.vector()) == state


def test_a_step_already_folded_in_changes_nothing():
    feed = Feeder()
    for _ in range(5):
        feed(*sparse_step(1.25e7, 10_000), values=10_000)
    before = feed.state
    again = controller.update(before, {"step_id": feed.step, "step_s": 9.0, "link_s": 9.0, "compress_s": 0.0,
                                       "dense": 1.0,
                                       "sent_bytes": 0.0, "values": 0.0, "capped": 1.0, "elements": 1.0}, DEFAULT)
    assert again == before


def test_a_sparse_step_s_first_is_counted_not_measured():
    feed = Feeder()
    feed(14.0, 0.01, values=10_000)  # the first step traced and compiled
    assert feed.state.sparse_s == 0.0 and feed.state.sparse_steps == 1
    feed(0.03, 0.01, values=10_000)
    assert feed.state.sparse_s == pytest.approx(0.03)


def test_the_fitted_line_tells_a_value_s_link_time_from_the_fixed_cost():
    feed = Feeder()
    counts = [5_000, 10_000, 20_000, 15_000, 30_000]  # the entropy rule's counts vary step to step
    for i in range(20):  # 100 Mbit/s beside a 4 ms fixed cost
        feed(*sparse_step(1.25e7, counts[i % 5]), values=counts[i % 5])
    assert value_s(feed.state, DEFAULT) == pytest.approx(VALUE_BYTES / 1.25e7, rel=0.01)
    for i in range(30):  # the link drops to 10 Mbit/s: the fit fades the old points
        feed(*sparse_step(1.25e6, counts[i % 5]), values=counts[i % 5])
    assert value_s(feed.state, DEFAULT) == pytest.approx(VALUE_BYTES / 1.25e6, rel=0.1)


def test_payloads_of_one_size_give_an_upper_bound_of_a_value_s_time():
    feed = Feeder()
    for _ in range(20):
        feed(*sparse_step(1.25e7, 10_000), values=10_000)
    assert value_s(feed.state, DEFAULT) == 0.0  # every step's link time is the least: free, as far as told
    feed(*sparse_step(1.25e6, 10_000), values=10_000)  # a slower link shows above the least
    assert value_s(feed.state, DEFAULT) > 0.0


def test_the_step_line_tells_what_a_value_costs_the_step_link_and_cpu_alike():
    feed = Feeder()
    counts = [5_000, 10_000, 20_000, 15_000, 30_000]
    for i in range(30):  # 100 Mbit/s, and 0.5 us of CPU per value sent (compaction, coding, decode)
        link = 0.004 + counts[i % 5] * VALUE_BYTES / 1.25e7
        feed(0.02 + link + 5e-7 * counts[i % 5], link, values=counts[i % 5])
    assert value_s(feed.state, DEFAULT) == pytest.approx(VALUE_BYTES / 1.25e7, rel=0.01)
    assert step_value_s(feed.state, DEFAULT) == pytest.approx(VALUE_BYTES / 1.25e7 + 5e-7, rel=0.01)


def test_the_cpu_a_value_adds_holds_while_the_values_vary_too_little_to_tell():
    feed = Feeder()
    for _ in range(20):  # one count every step: nothing told yet, the CPU counts as free
        feed(*sparse_step(1.25e7, 10_000), values=10_000, compress_s=0.005)
    assert step_value_s(feed.state, DEFAULT) == value_s(feed.state, DEFAULT)
    counts = [5_000, 10_000, 20_000, 15_000, 30_000]
    for i in range(60):  # the counts vary: 1 us of CPU per value shows
        feed(*sparse_step(1.25e7, counts[i % 5], other_s=0.02 + 1e-6 * counts[i % 5]), values=counts[i % 5])
    told = step_value_s(feed.state, DEFAULT) - value_s(feed.state, DEFAULT)
    assert told == pytest.approx(1e-6, rel=0.02)
    for _ in range(30):  # one count again: the last slope holds
        feed(*sparse_step(1.25e7, 10_000, other_s=0.03), values=10_000)
    assert step_value_s(feed.state, DEFAULT) - value_s(feed.state, DEFAULT) == pytest.approx(told, rel=0.01)


@pytest.mark.parametrize("bandwidth, moves", [(1e10, "down"), (1.25e6, "up")])
def test_the_price_moves_toward_the_values_share_of_the_step_and_no_faster_than_its_limit(bandwidth, moves):
    feed = Feeder()
    counts = [5_000, 10_000, 20_000, 15_000, 30_000]
    prices = []
    for i in range(40):  # 10 GB/s: the values cost nothing; 10 Mbit/s: 85 % of the step
        feed(*sparse_step(bandwidth, counts[i % 5]), values=counts[i % 5])
        prices.append(feed.state.price)
    assert (prices[-1] < prices[5] < 0.0) if moves == "down" else (prices[-1] > max(prices[5], 0.0))
    assert max(abs(a - b) for a, b in zip(prices, prices[1:])) <= DEFAULT.max_move + 1e-12


def test_the_ceiling_holding_stops_the_price_before_the_offer_runs_away():
    feed = Feeder()
    for _ in range(200):  # the rule offers 5x what the ceiling lets through; the values cost nothing
        feed(*sparse_step(1e10, 20_000), values=20_000, offered=100_000)
    assert feed.state.price > -DEFAULT.price_limit + 1.0
    assert feed.state.price == pytest.approx(DEFAULT.price_limit)  # nothing more to buy: it rises
    held = Feeder()
    for _ in range(50):  # 2x the ceiling on offer: the price holds where it is
        held(*sparse_step(1e10, 20_000), values=20_000, offered=40_000)
    assert held.state.price == 0.0


def test_a_slow_link_never_goes_dense_not_even_to_probe():
    # a 2.6M-parameter MLP on 20 Mbit/s: a dense step would carry 10.4 MB in 4 s
    feed = Feeder(elements=2_600_000)
    counts = [20_000, 40_000, 30_000, 50_000]
    for i in range(300):
        feed(*sparse_step(2.5e6, counts[i % 4], other_s=0.05), values=counts[i % 4])
        assert feed.state.dense == 0.0


def test_a_fast_link_goes_dense_after_one_probe_that_costs_at_most_its_share():
    feed, modes, jitter = Feeder(), [], np.random.default_rng(0).uniform(0.0, 5e-4, 400)
    for i in range(400):  # 10 GB/s: sparse steps are compress time and fixed cost (and jitter)
        if feed.state.dense:
            feed(0.012 + 0.0005, 0.0005 + 4e6 / 1e10, values=1_000_000, dense=True)
        else:
            feed(*sparse_step(1e10, 20_000, other_s=0.03, fixed_s=0.002 + jitter[i]), values=20_000,
                 compress_s=0.018)
        modes.append(feed.state.dense)
    first = modes.index(1.0)
    assert all(modes[first:]), modes
    # the probe was priced at the payloads' own throughput (66 KB in 2 ms: 33 MB/s, 0.13 s for 4 MB)
    assert 2 * (0.012 + 0.002 + 4e6 / 3.3e7) <= DEFAULT.probe_share * 0.032 * first < 3 * (0.012 + 0.002 + 4e6 / 3.3e7)


def test_a_noisy_slope_on_a_slow_link_buys_no_early_probe():
    # 100 Mbit/s, the MLP: counts vary, but a step's link time varies more (Horovod's rounds)
    feed, rng = Feeder(elements=1_860_000), np.random.default_rng(1)
    for i in range(300):
        values = rng.uniform(10_000, 40_000)
        link = 0.004 + values * VALUE_BYTES / 1.2e7 + rng.uniform(0.0, 0.02)
        feed(0.02 + link, link, values=values)
        assert feed.state.dense == 0.0 or i * 0.035 * DEFAULT.probe_share >= 2 * 0.6, i


def test_a_dense_link_that_slows_goes_back_to_sparse_and_a_near_tie_does_not_flap():
    feed = Feeder()
    for i in range(10):
        feed(*sparse_step(1.25e7, 20_000), values=20_000)
    sparse_s = feed.state.sparse_s
    feed.state.dense = 1.0
    flips = 0
    for _ in range(20):  # dense steps within the hysteresis band of a sparse step's worth
        before = feed.state.dense
        feed(sparse_s / DEFAULT.sparse_worth * 1.1, 0.01, values=1_000_000, dense=True)
        flips += before != feed.state.dense
    assert flips == 0 and feed.state.dense == 1.0
    for _ in range(5):  # the link slows: a dense step takes 3 s
        feed(3.0, 2.98, values=1_000_000, dense=True)
    assert feed.state.dense == 0.0


def test_an_evaluation_pause_does_not_swing_the_step_time():
    feed = Feeder()
    for _ in range(10):
        feed(0.03, 0.01, values=10_000)
    before = feed.state.sparse_s
    feed(5.0, 0.01, values=10_000)  # rank 0 evaluated between two steps
    assert feed.state.sparse_s < 2 * before


def test_the_link_time_is_the_last_rank_s_not_the_wait_of_the_first():
    # rank 0 reached the collective 45 ms early (its peer computed longer): link 50 ms and 5 ms
    ranks = [clock.carried(7, {"step_s": 0.07, "link_s": link, "compress_s": 0.01, "dense": 0.0, "sent_bytes": 1.0,
                               "values": 1.0, "capped": 1.0, "elements": 10.0, "trained": 1.0})
             for link in (0.05, 0.005)]
    means = np.mean(np.array(ranks), axis=0).tolist()
    shared = clock.shared_figures(means)
    assert shared["link_s"] == pytest.approx(0.005) and shared["step_id"] == 7


def test_a_rank_s_step_figures_come_from_every_gradient_s_stamps():
    # began, left, arrived, sent bytes, values, offered, elements, acc energy, least^2, dense
    raw = [[10.00, 10.02, 10.05, 330.0, 100, 120, 1000, 50.0, 0.2, 0.0],
           [10.01, 10.03, 10.04, 33.0, 10, 10, 3000, 30.0, 0.1, 0.0],
           [10.015, 10.025, 10.045, 0.0, 0, 0, 500, 30.0, float("inf"), 0.0]]  # sent nothing: not in capped
    began, f = clock.step_figures(raw, last_began=9.95)
    assert began == 10.0 and f["step_s"] == pytest.approx(0.05) and f["compress_s"] == pytest.approx(0.05)
    assert f["link_s"] == pytest.approx(10.05 - 10.03)  # the last arrival after the last hand-over
    assert f["values"] == 110 and f["elements"] == 4500 and f["trained"] == 1.0
    assert f["capped"] == pytest.approx((120 / 100) ** 0.25)  # the large tensor was not capped


def test_a_step_with_a_gradient_not_finite_is_carried_as_not_valid():
    # rank 1's second gradient overflowed: it sent one NaN, its accumulated energy is Inf
    raw = [[10.00, 10.02, 10.05, 330.0, 100, 120, 1000, 50.0, 0.2, 0.0],
           [10.01, 10.03, 10.04, 17.0, 0, 0, 3000, float("inf"), float("inf"), 0.0]]
    _, f = clock.step_figures(raw, last_began=9.95)
    assert f["trained"] == 0.0 and f["step_s"] == pytest.approx(0.05)
    assert clock.carried(3, f)[0] == 0.0
    _, f = clock.step_figures(raw[:1], last_began=9.95)
    assert f["trained"] == 1.0 and clock.carried(3, f)[0] == 1.0


@pytest.mark.parametrize("valid, folded", [(1.0, True), (0.5, False)])
def test_the_controller_folds_a_step_only_when_every_rank_carried_it_valid(valid, folded):
    budget = Budget()
    means = dict(zip(clock.CARRIED, [0.0] * len(clock.CARRIED)), valid=valid, step_id=5.0, step_s=0.05,
                 elements=1000.0, values=10.0, capped=1.0)  # 0.5: one rank of two skipped the step
    budget.shared.assign([means[name] for name in clock.CARRIED])
    budget._at_call()  # noqa: SLF001  (what runs before each call of the traced step)
    assert controller.State.of(budget.state.numpy()).step_id == (5 if folded else 0)


def closed_loop(n, steps, bandwidth, cpu_s=0.0, seed=0):
    """The controller driving a stand-in for the entropy rule under error feedback (Laplace
    gradients, threshold exp(h) (log n + price), floor and 2 % ceiling guards) on a link of 4 ms
    fixed cost and ``bandwidth(step)``; a step computes 20 ms and ``cpu_s`` per value sent.
    Returns the feeder, the step times and the densities sent."""
    rng = np.random.default_rng(seed)
    feed = Feeder(elements=n)
    residual, times, densities = np.zeros(n), [], []
    for step in range(steps):
        acc = residual + rng.laplace(0.0, 1.0, n)
        tau = 2 * math.e * max(math.log(n) + feed.state.price, 0.0)
        offered = int((np.abs(acc) > tau).sum())
        k = int(np.clip(offered, math.ceil(1e-4 * n), 0.02 * n))
        sent = np.argpartition(-np.abs(acc), k)[:k]
        residual = acc.copy()
        residual[sent] = 0.0
        link = 0.004 + k * VALUE_BYTES / bandwidth(step) + rng.normal(0.0, 5e-4)
        step_s = 0.02 + link + cpu_s * k + rng.normal(0.0, 1e-3)
        feed(step_s, link, values=k, offered=offered, compress_s=0.005 + cpu_s * k / 2)
        times.append(step_s)
        densities.append(k / n)
    return feed, times, densities


def test_an_evaluation_pause_adds_no_point_to_the_work_line():
    feed = Feeder()
    counts = [5_000, 10_000, 20_000, 15_000, 30_000]
    for i in range(60):  # 1 us of CPU per value; rank 0 evaluates for 3 s every 15 steps
        pause = 3.0 if i % 15 == 14 else 0.0
        feed(*sparse_step(1.25e7, counts[i % 5], other_s=0.02 + 1e-6 * counts[i % 5] + pause), values=counts[i % 5])
    assert step_value_s(feed.state, DEFAULT) - value_s(feed.state, DEFAULT) == pytest.approx(1e-6, rel=0.05)


def test_in_a_closed_loop_the_density_moves_smoothly():
    _, _, densities = closed_loop(200_000, 150, lambda step: 1.25e7)
    jumps = [max(a, b) / min(a, b) for a, b in zip(densities[20:], densities[21:])]
    assert max(jumps) < 10.0, max(jumps)  # error feedback alternates full and light steps, no more


def test_in_a_closed_loop_the_start_leaves_the_floor_within_a_few_steps():
    # the residual is empty and a position costs log n = 12 nats: the rule offers nothing at first
    _, _, densities = closed_loop(200_000, 30, lambda step: 2.5e6)
    assert densities[0] == pytest.approx(1e-4) and min(densities[8:]) > 1e-3, densities


def test_in_a_closed_loop_the_values_settle_at_their_share_of_the_step():
    feed, times, densities = closed_loop(200_000, 200, lambda step: 2.5e6)
    tail = densities[-50:]
    cost = statistics.median(times[-50:]) - 0.024  # the part of the step its values cost
    assert 0.5 * DEFAULT.elasticity < cost / statistics.median(times[-50:]) < 2 * DEFAULT.elasticity
    assert min(tail) > 1e-4 and max(tail) < 0.02  # neither the floor nor the ceiling


def test_in_a_closed_loop_a_slower_link_or_a_dearer_value_lowers_the_density():
    settled = lambda densities: statistics.median(densities[-60:])
    _, _, at_20 = closed_loop(200_000, 200, lambda step: 2.5e6)
    _, _, at_10 = closed_loop(200_000, 200, lambda step: 1.25e6)
    assert 1.5 < settled(at_20) / settled(at_10) < 2.5  # half the bandwidth, about half the values
    _, _, fast = closed_loop(200_000, 200, lambda step: 1.25e7)
    feed, times, slowed = closed_loop(200_000, 260, lambda step: 1.25e7 if step < 100 else 1.25e6)
    assert value_s(feed.state, DEFAULT) == pytest.approx(VALUE_BYTES / 1.25e6, rel=0.3)
    assert all(math.isfinite(t) for t in times)
    assert settled(slowed) < 0.6 * settled(fast)  # fast sits at the 2 % ceiling
    _, _, dear = closed_loop(200_000, 200, lambda step: 1.25e7, cpu_s=3e-6)  # 3 us of CPU per value
    assert settled(dear) < settled(fast) / 2


def test_no_gradient_s_cond_waits_for_another_s_on_horovod_s_per_tensor_path():
    # one writer: a gradient's branch writes only its own stamps, so TensorFlow's automatic
    # control dependencies join none of Horovod's per-gradient conds (benchmarks.chained)
    from benchmarks.chained import waits

    found = waits("gradpart")
    assert len(found) >= 3 and not any(found.values()), found
