"""The oracle study's fit (benchmarks.studies.oracle) on hand-made grid points."""
import pytest

from benchmarks.studies.oracle import density, predicted


def test_the_fit_recovers_the_fixed_part_the_cost_of_density_and_the_steps_elasticity():
    # a step of 20 ms plus 10 ms per 1 % of density; steps to 99 % as 50 * d ** -0.2
    points = [(d, 0.0, 50 * d ** -0.2, 20.0 + 10.0 * 100 * d) for d in (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)]
    t0, c, e = predicted(points)
    assert t0 == pytest.approx(20.0) and c == pytest.approx(10.0) and e == pytest.approx(0.2)


def test_a_grid_method_s_density_is_its_ratio_and_topk_s_its_default():
    assert density("topk-0.03%") == pytest.approx(0.0003) and density("topk") == pytest.approx(0.01)
