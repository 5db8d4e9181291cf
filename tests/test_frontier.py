"""benchmarks/frontier.py: interpolation on Top-k's accuracy-ratio frontier, per seed and epoch."""
import math

import pytest

from benchmarks import frontier


def _record(run, compressor, seed, epoch, ratio, acc, model="mlp"):
    return {"model": model, "run": run, "compressor": compressor, "seed": seed, "epoch": epoch,
            "ratio_total": ratio, "test_acc": acc}


def test_frontier_is_linear_in_log_ratio_and_not_extrapolated():
    points = [(10.0, 0.9), (1000.0, 0.7)]
    assert frontier.frontier_at(points, 100.0) == pytest.approx(0.8)  # halfway in log ratio
    assert frontier.frontier_at(points, 10.0) == pytest.approx(0.9)
    assert frontier.frontier_at(points, 1000.0) == pytest.approx(0.7)
    assert frontier.frontier_at(points, 9.9) is None and frontier.frontier_at(points, 1001.0) is None
    assert frontier.frontier_at([], 100.0) is None


def test_gaps_compare_within_the_same_seed_and_epoch():
    records = [_record("topk-a", "topk", 0, 1.0, 10.0, 0.90), _record("topk-b", "topk", 0, 1.0, 1000.0, 0.70),
               _record("topk-a", "topk", 1, 1.0, 10.0, 0.50), _record("topk-b", "topk", 1, 1.0, 1000.0, 0.30),
               _record("gp", "gradpart", 0, 1.0, 100.0, 0.85), _record("gp", "gradpart", 1, 1.0, 100.0, 0.35),
               _record("none", "none", 0, 1.0, None, 0.95)]
    g = frontier.gaps(records)
    assert set(g) == {("mlp", "gp")}
    assert [round(v, 6) for v, _ in g[("mlp", "gp")][1.0]] == [0.05, -0.05]
    assert frontier.cell(g[("mlp", "gp")][1.0]) == "+0.0±5.0"
    row = frontier.table(frontier.gaps(records), epochs=(1,)).splitlines()[-1]
    assert row == "| mlp | gp | 2 | 100x, +0.0±5.0 |"


def test_a_ratio_outside_the_frontier_is_shown_as_beyond():
    records = [_record("topk-a", "topk", 0, 2.0, 10.0, 0.9), _record("topk-b", "topk", 0, 2.0, 100.0, 0.8),
               _record("gp", "gradpart", 0, 2.0, 500.0, 0.7)]
    assert frontier.table(frontier.gaps(records), epochs=(2,)).splitlines()[-1] == "| mlp | gp | 1 | 500x, beyond |"
    assert math.isclose(frontier.frontier_at([(10.0, 0.9), (100.0, 0.8)], 100.0), 0.8)


def test_gaps_to_none_pair_each_run_with_the_same_seed():
    records = [_record("none", "none", 0, 1.0, None, 0.9), _record("none", "none", 1, 1.0, None, 0.8),
               _record("gp", "gradpart", 0, 1.0, 200.0, 0.85), _record("gp", "gradpart", 1, 1.0, 100.0, 0.8),
               _record("gp", "gradpart", 2, 1.0, 100.0, 0.1)]  # seed 2 has no uncompressed run
    g = frontier.gaps_to_none(records)
    assert [round(v, 6) for v, _ in g[("mlp", "gp")][1.0]] == [-0.05, 0.0]
    assert frontier.table(g, epochs=(1,), against="none").splitlines()[-1] == "| mlp | gp | 2 | 150x, -2.5±2.5 |"
