"""Shared test set-up: one TF thread pair per process, a launcher for
scripts that must run under ``horovodrun`` with several ranks, the
cluster lock that every module marked ``cluster`` holds while it runs, and
the two tiers: ``make test`` runs what is not marked ``slow`` (minutes),
``make test-slow`` the rest, ``make test-all`` everything; cluster tests are always ``slow``.
The fast tier runs on two pytest-xdist workers (``JOBS``): its tests run in one process each,
with one TensorFlow thread; the slow tier's launches run one at a time (two at once on two cores
doubled each one's time, measured)."""
import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

PARALLEL = Path(__file__).parent / "parallel"


# The lock every user of the edge cluster takes (benchmarks/suite.sh, `flock ... <command>`): a
# script that finds the cluster up reuses it and takes it down when it ends, which cuts the link
# under a test's running ranks (Gloo then fails with "Timed out waiting 30000ms for recv").
CLUSTER_LOCK = Path("/tmp/hvd_gradpart_cluster.lock")
CLUSTER_LOCK_WAIT_S = 1800


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: needs root and network namespaces (the edge cluster)")
    config.addinivalue_line("markers", "slow: left out of the fast tier (`make test`); `make test-all` runs it")


def pytest_collection_modifyitems(items):
    """Every cluster test belongs to the whole suite only (it builds the namespaces)."""
    for item in items:
        if item.get_closest_marker("cluster") is not None:
            item.add_marker(pytest.mark.slow)


def _lock_holders(fd):
    """Pids holding a flock on the file open as ``fd`` (from /proc/locks)."""
    inode = os.fstat(fd).st_ino
    holders = set()
    for fields in (line.split() for line in Path("/proc/locks").read_text().splitlines()):
        if len(fields) > 5 and fields[1] == "FLOCK" and int(fields[5].rsplit(":", 1)[1]) == inode:
            holders.add(int(fields[4]))
    return holders


def _ancestors():
    pids, pid = set(), os.getpid()
    while pid > 1:
        pids.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


@pytest.fixture(scope="module", autouse=True)
def cluster_lock(request):
    """Holds the cluster lock through each module marked ``cluster`` (as it is when pytest itself
    runs under ``flock``); modules without the mark take nothing."""
    if request.node.get_closest_marker("cluster") is None:
        yield
        return
    fd = os.open(CLUSTER_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        if _lock_holders(fd) & _ancestors():
            yield
            return
        deadline = time.time() + CLUSTER_LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.time() > deadline:
                    pytest.fail(f"{CLUSTER_LOCK} still held after {CLUSTER_LOCK_WAIT_S}s "
                                f"(pids {sorted(_lock_holders(fd))}): the edge cluster is in use")
                time.sleep(2)
        yield
    finally:
        os.close(fd)
HOROVODRUN = Path(sys.executable).with_name("horovodrun")


def launch_env():
    """This process's environment without the MPI singleton state that ``hvd.init()`` in a test
    of this process leaves behind (``OMPI_*``/``PMIX_*``): a child ``mpirun`` that inherits it
    exits 1 without a word."""
    keep = {"OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"}
    return {k: v for k, v in os.environ.items()
            if k in keep or not k.startswith(("OMPI_", "PMIX_", "OPAL_", "ORTE_"))}


def horovodrun(script, np=2, backend="gloo", args=(), timeout=240, hosts=None):
    """Runs ``tests/parallel/<script>`` on ``np`` local ranks; returns its output.

    Fails the calling test with the combined output when the launch exits
    non-zero or outlives ``timeout`` seconds (a hang is a failure, not a wait).
    """
    cmd = [str(HOROVODRUN), "-np", str(np), "-H", hosts or f"localhost:{np}", f"--{backend}",
           sys.executable, str(PARALLEL / script), *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=launch_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} hung for {timeout}s:\n{e.stdout}\n{e.stderr}")
    out = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {done.returncode}:\n{out[-6000:] or '(no output)'}")
    return out
