"""benchmarks/projection.py: time to accuracy from simulated evaluations and the scaling model."""
import pytest

from benchmarks import projection, scaling

# 1 MB dense gradient, 10 ms compute, 20 ms sparse fixed cost, a 1 MB/s link at full efficiency
C = scaling.Constants(model="m", batch=32, t_compute=0.01, dense_bytes=1e6, sparse_bytes=0.0, small_bytes=0.0,
                      bandwidth=1e6, efficiency=1.0, overhead=0.02)


def _record(run, seed, step, acc, ratio):
    return {"model": "m", "run": run, "seed": seed, "step": step, "test_acc": acc, "ratio": ratio}


def test_each_quarter_is_timed_at_its_own_ratio():
    records = [_record("sp", 0, 10, 0.5, 100.0), _record("sp", 0, 30, 0.8, 1000.0)]
    # 10 steps at 0.01 + 0.02 + 1e6/100/1e6 = 0.04 s, then 20 steps at 0.031 s
    assert projection.reach(records, C, 1e6, 0.8) == (pytest.approx(10 * 0.04 + 20 * 0.031), 30)
    assert projection.reach(records, C, 1e6, 0.5) == (pytest.approx(0.4), 10)
    assert projection.reach(records, C, 1e6, 0.81) == (None, None)


def test_dense_steps_pay_the_ring_volume_and_no_fixed_cost():
    # 2 nodes: the ring moves 2 (N-1)/N M = M per rank, 1 s on this link, plus compute
    assert projection.reach([_record("none", 0, 5, 0.9, None)], C, 1e6, 0.9) == (pytest.approx(5 * 1.01), 5)


def test_targets_are_shares_of_the_same_seeds_final_accuracy():
    records = [_record("none", 0, 10, 0.80, None), _record("none", 0, 20, 1.00, None),
               _record("none", 1, 10, 0.50, None), _record("none", 1, 20, 0.60, None),
               _record("sp", 0, 10, 0.96, 100.0), _record("sp", 1, 10, 0.40, 100.0),
               _record("sp", 1, 20, 0.58, 100.0)]
    rows = {(r["run"], r["target"]): r for r in projection.projections(records, lambda m: C, ["8mbit"], [0.95])}
    sp = rows[("sp", 0.95)]  # seed 0 needs 0.95, reached at step 10; seed 1 needs 0.57, reached at step 20
    assert (sp["reached"], sp["seeds"], sp["steps"]) == (2, 2, 15)
    assert sp["seconds"] == pytest.approx((10 * 0.04 + 20 * 0.04) / 2)
    assert rows[("none", 0.95)]["reached"] == 2
    lines = projection.table(list(rows.values())).splitlines()
    assert lines[2].startswith("| m | 8mbit | 95% | sp | 2/2 |")  # faster than none on this link
