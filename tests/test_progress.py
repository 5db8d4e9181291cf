"""Time to accuracy from hand-made evaluation records."""
import pytest

from harness.progress import Reached, epoch_records, evaluation_points, slowest_step, targets, time_to_accuracy


def record(step, train_s, acc, epoch, end=False):
    return {"step": step, "train_s": train_s, "test_acc": acc, "epoch": epoch, "epoch_end": end}


RUN = [record(10, 2.0, 0.50, 0.5), record(20, 4.5, 0.80, 1, True),
       record(30, 6.0, 0.90, 1.5), record(40, 8.0, 0.85, 2, True)]


def test_first_evaluation_at_or_above_the_target_counts():
    assert time_to_accuracy(RUN, 0.80) == Reached(4.5, 20, 1, 0.80)  # equal counts as reached
    assert time_to_accuracy(RUN, 0.81) == Reached(6.0, 30, 1.5, 0.90)  # mid-epoch record, not the epoch's end
    assert time_to_accuracy(RUN, 0.0) == Reached(2.0, 10, 0.5, 0.50)


def test_a_later_dip_does_not_undo_the_first_crossing():
    assert time_to_accuracy(RUN, 0.86).train_s == 6.0


def test_never_reached_is_none():
    assert time_to_accuracy(RUN, 0.95) is None
    assert time_to_accuracy([], 0.5) is None


def test_targets_are_shares_of_the_reference_final_epoch_record():
    # The final record is the last epoch end (0.85), not the best evaluation (0.90).
    assert targets(RUN) == {0.95: pytest.approx(0.8075), 0.99: pytest.approx(0.8415)}
    assert targets(RUN + [record(45, 9.0, 0.99, 2.25)], shares=(0.5,)) == {0.5: pytest.approx(0.425)}


def test_epoch_records_keep_epoch_ends_and_unflagged_old_records():
    assert [r["epoch"] for r in epoch_records(RUN)] == [1, 2]
    old = [{"epoch": 1, "test_acc": 0.3}, {"epoch": 2, "test_acc": 0.6}]
    assert epoch_records(old) == old


def test_records_without_the_training_clock_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="older scripts/train.py; rerun"):
        time_to_accuracy([{"epoch": 1, "test_acc": 0.9, "wall_s": 3.0}], 0.5)


@pytest.mark.parametrize("steps, every, points", [
    (62, 0.25, [16, 31, 47, 62]),
    (10, 0.1, list(range(1, 11))),   # no float drift: 0.1 * 3 * 10 is the third step
    (10, 0.3, [3, 6, 9, 10]),        # the epoch's end is always evaluated
    (10, 1.0, [10]),
    (3, 0.1, [1, 2, 3]),             # more evaluations asked than steps: one per step
    (1, 0.5, [1]),
])
def test_evaluation_points(steps, every, points):
    assert evaluation_points(steps, every) == points


@pytest.mark.parametrize("steps, every", [(0, 0.5), (10, 0.0), (10, 1.5)])
def test_evaluation_points_refuse_bad_input(steps, every):
    with pytest.raises(ValueError, match="every in"):
        evaluation_points(steps, every)


def test_slowest_step_is_over_the_median_and_leaves_the_first_step_out():
    intervals = [{"step": 1, "interval_s": 9.0}] + [{"step": s, "interval_s": 0.1} for s in range(2, 10)]
    intervals[5]["interval_s"] = 0.35
    assert slowest_step(intervals) == pytest.approx(3.5)
    assert slowest_step(intervals[:1]) is None
