"""Elastic training with GradPart on the three-node namespace cluster (``benchmarks.elastic``).

One launch of ``scripts/elastic_loop.py`` with 3 ranks and ``--min-np 2``: edge-c's training
process is killed mid-run, the other two go on, and edge-c is taken in again after Horovod's
cooldown; then edge-c's link is cut, the other two go on again, and the node comes back once the
link does; 10 steps later the test ends the job through its stop file. The job must finish,
every rank must hold the same weights at every step it logged, and the test accuracy must be
that of a trained model. Every wait is bounded
(``benchmarks.elastic.EVENT_TIMEOUT_S``, ``END_TIMEOUT_S``), so a hang fails instead of waiting.
"""
import pytest

from benchmarks import elastic
from test_edge_cluster import _WHY, cluster_for_module  # noqa: F401  (skips this module with the same loud reason)

pytestmark = pytest.mark.cluster

edge = cluster_for_module("ELASTIC TESTS", nodes=3)


@pytest.fixture(scope="module")
def run(edge, tmp_path_factory):
    prefix = tmp_path_factory.mktemp("elastic") / "steps"
    try:
        outcome = elastic.faulted(prefix, seed=0, epochs=20, step_delay=0.05, stop=True)
    except elastic.Stalled as e:
        log = prefix.with_name("steps.launch.log")
        pytest.fail(f"{e}; launch output:\n{log.read_text()[-4000:] if log.exists() else '(none)'}")
    return {**outcome, **elastic.summarize(prefix, outcome["events"])}


def test_the_job_shrinks_to_two_and_grows_back_to_three_twice(run):
    print("events:", run["events"], "\nworld sizes:", run["timeline"], "\nsteps lost:", run["steps_lost"])
    assert run["exit"] == 0, run
    assert [size for _, size in run["timeline"]] == [3, 2, 3, 2, 3], run["timeline"]
    assert [name for name, _ in run["events"]][-2:] == ["stop file", "end"]


def test_every_rank_holds_the_same_weights_at_every_step(run):
    assert run["checked_steps"] > 100
    assert not run["ranks_differ_at"], f"(steps, size) where the ranks' weights differ: {run['ranks_differ_at']}"


def test_a_reset_rolls_back_at_most_the_steps_since_the_last_commit(run):
    assert all(0 <= lost < 5 for lost in run["steps_lost"]), run["steps_lost"]  # --commit-every 5


def test_the_leaving_ranks_took_a_bounded_residual_and_the_model_trained(run):
    print("departures:", run["departures"], "test accuracy:", run["test_acc"])
    assert len(run["departures"]) == 2 and all(d["host"] == elastic.VICTIM for d in run["departures"])
    assert all(0 <= d["ratio"] < 20 for d in run["departures"])
    assert run["test_acc"] > 0.8
