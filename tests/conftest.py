"""Shared test set-up: one TF thread pair per process, and a launcher for
scripts that must run under ``horovodrun`` with several ranks."""
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

PARALLEL = Path(__file__).parent / "parallel"


def pytest_configure(config):
    config.addinivalue_line("markers", "cluster: needs root and network namespaces (the edge cluster)")
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
