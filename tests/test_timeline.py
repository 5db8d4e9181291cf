"""benchmarks.timeline: one collective per backend op and begin time, however many tensors share it."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))

from benchmarks import timeline  # noqa: E402


def spans(pid, *nested):
    """B/E events of ``nested`` ``(name, begin, end)`` spans of one trace pid, outermost first."""
    begins = [{"ph": "B", "name": n, "ts": b, "pid": pid} for n, b, _ in nested]
    ends = [{"ph": "E", "ts": e, "pid": pid} for _, _, e in reversed(nested)]
    return begins + ends


# Two markers fused into one allreduce (same begin, per-tensor ends) and one allgather, per step.
STEP = (spans(1, ("ALLREDUCE", 0, 900), ("GLOO_ALLREDUCE", 100, 800))
        + spans(2, ("ALLREDUCE", 2, 900), ("GLOO_ALLREDUCE", 103, 600))
        + spans(3, ("NEGOTIATE_ALLGATHER", 0, 50)) + spans(3, ("ALLGATHER", 900, 3000),
                                                             ("GLOO_ALLGATHER", 1000, 3000)))


def test_fused_tensors_count_as_one_collective_from_first_begin_to_last_end():
    found = timeline.collectives(STEP)
    assert found == [("GLOO_ALLREDUCE", 100, 700, 2), ("GLOO_ALLGATHER", 1000, 2000, 1)]


def test_per_step_counts_and_medians():
    later = [{**e, "ts": e["ts"] + 10_000} for e in STEP]
    got = timeline.per_step(timeline.collectives(STEP + later), steps=2)
    assert got == {"GLOO_ALLGATHER": {"per_step": 1.0, "tensors_each": 1.0, "median_ms": 2.0},
                   "GLOO_ALLREDUCE": {"per_step": 1.0, "tensors_each": 2.0, "median_ms": 0.7}}


def test_rounds_count_the_cycles_that_ran_a_collective():
    found = timeline.collectives(STEP)
    one_cycle = [{"ph": "i", "name": "CYCLE_START", "ts": 90}]
    assert timeline.rounds(STEP + one_cycle, found, steps=1) == 1.0
    assert timeline.rounds(STEP + one_cycle + [{"ph": "i", "name": "CYCLE_START", "ts": 950}], found, steps=1) == 2.0
    assert timeline.rounds(STEP, found, steps=1) is None


def test_a_file_horovod_left_open_loads(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in STEP) + ",")
    assert timeline.load(path) == STEP
