"""Shell injection through host names and script options: refused, never executed.

Every attempt would create a marker file if any shell ran it; each must fail
with a clear error and leave no marker.
"""
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launch_env

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier

ROOT = Path(__file__).parents[1]
HOROVODRUN = Path(sys.executable).with_name("horovodrun")
CLUSTER = ROOT / "scripts" / "edge_cluster.sh"
STATE_DIR = Path("/run/hvd_gradpart_edge")


@pytest.fixture
def marker(tmp_path):
    """A path that exists only if an injected command ran; yields a payload factory."""
    path = tmp_path / "PWNED"
    payloads = [f"$(touch {path})", f"$(touch${{IFS}}{path})", f"`touch {path}`", f";touch {path}",
                f"|touch {path}", f"&&touch {path}"]
    yield path, payloads
    assert not path.exists(), "an injected shell command was executed"


def run(*cmd, timeout=60):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout,
                          env=launch_env(), cwd=ROOT)


def test_launch_refuses_injected_hostfile_and_hosts(marker, tmp_path):
    _, payloads = marker
    for payload in payloads:
        hostfile = tmp_path / "hosts"
        hostfile.write_text(f"edge-a{payload} slots=1\nedge-b slots=1\n")
        done = run(sys.executable, ROOT / "scripts" / "launch.py", "-np", "2", "-hostfile", hostfile, "true")
        assert done.returncode == 2, (payload, done.stdout, done.stderr)
        assert f"{hostfile} line 1: " in done.stderr and "launch.py: error:" in done.stderr, done.stderr
        done = run(sys.executable, ROOT / "scripts" / "launch.py", "-np", "2", "-H", f"edge-a{payload}:1,edge-b:1",
                   "true")
        assert done.returncode == 2 and "invalid host name" in done.stderr, (payload, done.stderr)


def test_horovodrun_itself_refuses_injected_host_names(marker, tmp_path):
    path, payloads = marker
    hostfile = tmp_path / "hosts"
    hostfile.write_text(f"edge-a$(touch${{IFS}}{path}) slots=1\nedge-b slots=1\n")
    for how in (["-hostfile", hostfile], ["-H", f"edge-a{payloads[0]}:1,edge-b:1"]):
        done = run(HOROVODRUN, "-np", "2", *how, "--gloo", "true")
        assert done.returncode != 0 and "Invalid host input" in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("option", [("up", "--rate"), ("up", "--nodes"), ("up", "--delay"), ("rate",)])
def test_edge_cluster_refuses_injected_options(marker, option):
    _, payloads = marker
    existed = STATE_DIR.exists()
    for payload in payloads:
        for value in (f"1mbit{payload}", f"2{payload}", payload):
            done = run("bash", CLUSTER, *option, value)
            assert done.returncode == 2, (option, value, done.stdout, done.stderr)
            assert "invalid" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert STATE_DIR.exists() == existed
