"""Time to accuracy: when a run first reached a target test accuracy.

``scripts/train.py --eval-every F`` evaluates the model every ``F`` of an epoch
and at every epoch's end, and writes one record per evaluation. Each record
carries ``train_s`` (the training clock: seconds spent in training steps,
evaluation and BatchNorm recalibration excluded), ``first_step_s`` (the first
step's share of ``train_s``: tracing and XLA compiling, reported on its own;
time to accuracy counted after it is ``train_s - first_step_s``), ``step``
(optimizer steps so far), ``epoch`` (epochs so far, fractional between epoch
ends) and ``epoch_end`` (true on the one record that closes each epoch, the
record older readers expect). A run ended by ``--max-steps``, ``--stop-at-acc``
or ``--max-train-s`` carries ``stopped`` (``max_steps``, ``stop_at_acc``,
``max_train_s``) on its last record, which may fall within an epoch. A run
reaches a target at the first evaluation whose test accuracy is at or above
it; the time reported is that evaluation's training clock, so it overstates
the true crossing by less than one evaluation interval. Targets are shares of
the reference run's (no compression's) final accuracy.
"""
import math
import statistics
from typing import NamedTuple

SHARES = (0.95, 0.99)  # targets: these shares of the reference's final test accuracy


class Reached(NamedTuple):
    """The first evaluation at or above a target accuracy."""

    train_s: float  # training seconds by then (evaluation excluded)
    step: int       # optimizer steps by then
    epoch: float    # epochs by then
    test_acc: float  # the accuracy that evaluation measured
    first_step_s: float = 0.0  # the first step's share of train_s (0 in records older than the field)

    @property
    def clock_s(self):
        """Training seconds after the first step: the time-to-accuracy clock."""
        return self.train_s - self.first_step_s


def evaluation_points(steps_per_epoch, every):
    """The steps within an epoch (1-based) after which to evaluate.

    Args:
        steps_per_epoch: optimizer steps in one epoch, >= 1.
        every: fraction of an epoch between evaluations, in (0, 1].

    Returns:
        Sorted steps: the first step at or past each multiple of ``every`` of the
        epoch, and always the epoch's last step.
    """
    if steps_per_epoch < 1 or not 0 < every <= 1:
        raise ValueError(f"need steps_per_epoch >= 1 and every in (0, 1], got {steps_per_epoch} and {every}")
    tolerance = 1e-9  # 0.1 * 3 * 10 is 3.0000000000000004, and still the third step
    points = {math.ceil(k * every * steps_per_epoch - tolerance) for k in range(1, math.ceil(1 / every) + 1)}
    return sorted({p for p in points if 0 < p < steps_per_epoch} | {steps_per_epoch})


def epoch_records(records):
    """The records that close an epoch (records without the flag predate it and are all such)."""
    return [r for r in records if r.get("epoch_end", True)]


def final_record(records):
    """The record a run ended at: the one marked ``stopped`` by a stop rule, else the last epoch's end."""
    return records[-1] if records and records[-1].get("stopped") else epoch_records(records)[-1]


def targets(reference, shares=SHARES):
    """``{share: share * final test accuracy of reference}``."""
    final = final_record(reference)["test_acc"]
    return {share: share * final for share in shares}


def time_to_accuracy(records, target):
    """The first of ``records`` (in training order) whose test accuracy reaches ``target``.

    Args:
        records: one run's evaluation records, as train.py writes them.
        target: test accuracy to reach, in [0, 1].

    Returns:
        A :class:`Reached`, or None when no evaluation reached ``target``.

    Raises:
        ValueError: a record lacks the training clock (written before ``--eval-every`` existed).
    """
    old = next((r for r in records if "train_s" not in r or "step" not in r), None)
    if old is not None:
        raise ValueError(f"the record of epoch {old.get('epoch')} has no train_s/step: it was written by an "
                         "older scripts/train.py; rerun the training to get time to accuracy")
    return next((Reached(r["train_s"], r["step"], r["epoch"], r["test_acc"], r.get("first_step_s") or 0.0)
                 for r in records if r["test_acc"] >= target), None)


def slowest_step(intervals):
    """The slowest step over the median step, from ``train.py --steps-jsonl`` records of every
    step (``--log-every-steps 1``), the first step (tracing, compiling) left out; None without
    such records. A clock to trust has no step far above the median."""
    times = [r["interval_s"] for r in intervals if r["step"] > 1]
    return max(times) / statistics.median(times) if times else None
