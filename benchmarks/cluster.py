"""The edge cluster for the drivers: its lock, bringing it up at a run's rate, two-rank launches.

Every user of the cluster holds the lock (``CLUSTER_LOCK``, the ``flock`` file that
``benchmarks/suite.sh`` takes) while it uses it; ``scripts/edge_cluster.sh`` builds, shapes and
takes down the nodes; ``scripts/launch.py --gloo`` starts ``scripts/train.py`` on two ranks.
"""
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = os.environ.get("CLUSTER_LOCK", "/tmp/hvd_gradpart_cluster.lock")
HOSTS = {"edge": ["-hostfile", str(ROOT / "hostfiles" / "edge")], "local": ["-H", "localhost:2"]}


@contextlib.contextmanager
def cluster_lock():
    """Holds the cluster lock, saying so when another user has it first."""
    with open(LOCK, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"cluster: waiting for the cluster lock {LOCK} ...", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


class Cluster:
    """The edge cluster, up at a run's rate while the run holds the lock; ``local``: none."""

    def __init__(self, local):
        self.local, self.built = local, False

    @contextlib.contextmanager
    def hold(self, link):
        if self.local:
            yield
            return
        with cluster_lock():
            self.script("up", "--rate", link)
            self.built = True
            yield

    def close(self):
        """Takes the cluster down (under the lock) if this driver brought it up."""
        if self.built:
            with cluster_lock():
                self.script("down")

    @staticmethod
    def script(*args):
        done = subprocess.run(["bash", str(ROOT / "scripts" / "edge_cluster.sh"), *args],
                              capture_output=True, text=True)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            hint = " (--local runs on this machine instead)" if done.returncode == 3 else ""
            sys.exit(f"error: scripts/edge_cluster.sh {' '.join(args)} failed: {why}{hint}")


@contextlib.contextmanager
def train_launch(train_args, hosts, log):
    """``scripts/train.py train_args`` on two ranks through ``scripts/launch.py --gloo``, its
    output in ``log``; yields the running launch, which ends (its whole process group) if it
    still runs when the block exits."""
    cmd = [sys.executable, str(ROOT / "scripts" / "launch.py"), "-np", "2", *hosts, "--gloo",
           "--disable-cache", sys.executable, str(ROOT / "scripts" / "train.py"), *train_args]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    with open(log, "w") as out:
        out.write(" ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            yield proc
        finally:
            if proc.poll() is None:  # the driver is stopping: the launch ends with it
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait()
