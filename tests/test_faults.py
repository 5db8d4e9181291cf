"""Faults on the two-node namespace cluster, in one launch of train.py per compressor.

Training with GradPart, and with no compression as the reference (dense, so the link sets
the pace), starts at 100 Mbit/s; the link is re-shaped to 10 Mbit/s mid-run (training must go
on without a stalled step, and the dense run's per-interval throughput log must show the
drop); then the training process on edge-b is killed by its pid: the launch
(``scripts/launch.py`` around ``horovodrun``) must exit non-zero within a bound, with a
message naming edge-b, and leave no rank behind on either node.

The link never stalls the run: a dense LeNet-5 step moves 0.43 MB each way, 0.35 s at
10 Mbit/s, far below Gloo's timeout per collective (pinned at its default, 30 s, so that a real
stall still fails), and every interval after the change is held to a tenth of it per step. The
one known way to stall it is to take the cluster down under the run: a script that finds the
cluster up reuses it and takes it down when it ends; conftest's ``cluster_lock`` keeps such
scripts out while this module runs.
"""
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.elastic import namespace_pids
from conftest import launch_env
from test_edge_cluster import _WHY, cluster, cluster_for_module  # noqa: F401  (skips this module with the same loud reason)

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).parents[1]
LAUNCH = ROOT / "scripts" / "launch.py"
TRAIN = ROOT / "scripts" / "train.py"
EXIT_BOUND_S = 60  # from the kill to the launch's exit
LINGER_S = 10  # from the launch's exit to the last rank's exit
SLOW_INTERVALS = 4  # intervals logged wholly after the rate change
STEPS_PER_INTERVAL = 5
GLOO_TIMEOUT_S = 30  # Horovod's default, set explicitly: a collective this slow is a stall
STEP_BOUND_S = GLOO_TIMEOUT_S / 10  # per step at 10 Mbit/s; about 0.5 s measured


edge = cluster_for_module("FAULT TESTS")


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for(path, count, launch, timeout, log):
    """Waits until ``path`` holds ``count`` records; fails if the launch ends or stalls first."""
    deadline = time.time() + timeout
    while len(records(path)) < count:
        if launch.poll() is not None:
            pytest.fail(f"training ended (exit {launch.returncode}) before {count} intervals were logged; "
                        f"intervals {records(path)}; launch output:\n{log.read_text()[-3000:]}")
        if time.time() > deadline:
            pytest.fail(f"training logged {len(records(path))} of {count} intervals in {timeout}s; "
                        f"launch output:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)


def train_pids(node, marker):
    """The processes running train.py with ``marker`` in namespace ``node``."""
    return namespace_pids(node, TRAIN, marker)


@pytest.fixture(scope="module", params=["none", "gradpart"])
def faulted_run(edge, tmp_path_factory, request):
    """One launch: rate change after 4 intervals, kill of edge-b's rank after SLOW_INTERVALS more."""
    steps = tmp_path_factory.mktemp(f"faults-{request.param}") / "steps.jsonl"
    log = steps.with_name("launch.log")
    with open(log, "w") as out:
        launch = subprocess.Popen(
            # --start-timeout: horovodrun's probe of the hosts took over its default 30 s under load.
            [sys.executable, str(LAUNCH), "-np", "2", "-hostfile", str(ROOT / "hostfiles" / "edge"), "--gloo",
             "--disable-cache", "--start-timeout", "120", sys.executable, str(TRAIN), "--model", "lenet5",
             "--dataset", "mnist5k", "--compressor", request.param, "--epochs", "100", "--eval-every", "1",
             "--log-every-steps", str(STEPS_PER_INTERVAL), "--steps-jsonl", str(steps)],
            stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True,
            env={**launch_env(), "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S)})
        try:
            wait_for(steps, 4, launch, timeout=240, log=log)
            switched_after = len(records(steps))
            cluster("rate", "10mbit")
            wait_for(steps, switched_after + 1 + SLOW_INTERVALS, launch, timeout=120, log=log)
            victims = train_pids("edge-b", str(steps))
            assert len(victims) == 1, f"expected one train.py process in edge-b, found {victims}"
            os.kill(victims[0], signal.SIGKILL)
            killed = time.time()
            try:
                launch.wait(timeout=EXIT_BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the launch still runs {EXIT_BOUND_S}s after edge-b's rank was killed (a hang)")
            exit_s = time.time() - killed
        finally:
            if launch.poll() is None:
                os.killpg(launch.pid, signal.SIGKILL)  # launch.py, horovodrun and its ssh clients
                launch.wait()
    deadline = time.time() + LINGER_S
    while (left := train_pids("edge-a", str(steps)) + train_pids("edge-b", str(steps))) and time.time() < deadline:
        time.sleep(0.5)
    return {"records": records(steps), "switched_after": switched_after, "exit_s": exit_s,
            "returncode": launch.returncode, "output": log.read_text(), "left": left, "compressor": request.param}


def test_training_goes_on_through_a_rate_change_without_a_stall(faulted_run):
    recs, switched = faulted_run["records"], faulted_run["switched_after"]
    fast = [r["samples_per_s"] for r in recs[1:switched]]  # the first interval holds tracing
    slow = [r["samples_per_s"] for r in recs[switched + 1:]]  # wholly after the change
    assert len(fast) >= 3 and len(slow) >= SLOW_INTERVALS, recs
    assert [r["step"] for r in recs] == [STEPS_PER_INTERVAL * (i + 1) for i in range(len(recs))], \
        "training skipped or stalled"
    print(f"{faulted_run['compressor']}: median samples/s {statistics.median(fast):.0f} at 100mbit, "
          f"{statistics.median(slow):.0f} at 10mbit")
    if faulted_run["compressor"] == "none":  # dense lenet5 sends 0.43 MB per step: 35 ms at 100 Mbit/s, 350 at 10
        assert statistics.median(slow) < 0.5 * statistics.median(fast), (fast, slow)
    worst = max(r["interval_s"] for r in recs[switched:]) / STEPS_PER_INTERVAL
    print(f"slowest step from the change on: {worst:.2f} s (bound {STEP_BOUND_S:.0f} s)")
    assert worst < STEP_BOUND_S, f"the link stalled after the rate change: {recs[switched:]}"


def test_killed_node_fails_the_launch_fast_and_names_it(faulted_run):
    out = faulted_run["output"]
    assert faulted_run["returncode"] != 0, out[-3000:]
    print(f"the launch exited {faulted_run['exit_s']:.1f}s after the kill")
    assert faulted_run["exit_s"] < EXIT_BOUND_S
    assert "train.py: ranks 0 on edge-a, 1 on edge-b" in out, out[-3000:]
    assert "Process name: 1" in out, out[-3000:]  # Horovod's own message gives the rank only
    last = out.strip().splitlines()[-1]
    assert last.startswith("launch.py: error: rank 1 on edge-b failed first (exit "), out[-3000:]
    assert not faulted_run["left"], f"train.py still running {LINGER_S}s after the launch: {faulted_run['left']}"
