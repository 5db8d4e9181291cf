"""Relaxed ssh host-key checking applies to the cluster's nodes only, never globally.

Asks ssh itself (``ssh -G``, which prints the options it would use and
connects nowhere) before, during and after ``edge_cluster.sh up``; and
``scripts/launch.py`` refuses hosts whose keys the user's policy rejects,
though horovodrun itself would not check them.
"""
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launch_env

from test_edge_cluster import _WHY, SSH_CONFIG, cluster, no_cluster_up  # noqa: F401  (skips likewise)

pytestmark = pytest.mark.cluster
NODES = ("edge-a", "edge-b")
OTHERS = ("localhost", "10.213.57.11", "edge-c", "build.example.com")  # incl. a node's bare address
LAUNCH = Path(__file__).parents[1] / "scripts" / "launch.py"
RELAXED = {"stricthostkeychecking": "false", "userknownhostsfile": "/dev/null"}


def options(host):
    out = subprocess.run(["ssh", "-G", host], capture_output=True, text=True, check=True, timeout=10).stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def relaxed(host):
    opts = options(host)
    return {k: opts.get(k) for k in RELAXED} == RELAXED


def system_config():
    files = [Path("/etc/ssh/ssh_config"), *sorted(Path("/etc/ssh/ssh_config.d").glob("*"))]
    return {str(f): hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.is_file()}


def test_relaxed_checking_only_for_the_cluster_nodes():
    no_cluster_up()
    before = {h: options(h) for h in NODES + OTHERS}
    system = system_config()
    try:
        cluster("up", timeout=120)
        assert all(relaxed(h) for h in NODES)
        for host in OTHERS:
            assert options(host) == before[host], f"up changed the ssh options for {host}"
        rest = SSH_CONFIG.read_text().split("# hvd_gradpart edge cluster END\n", 1)[1]
        for word in ("StrictHostKeyChecking", "UserKnownHostsFile"):
            assert word not in rest, f"{word} outside the cluster's block in {SSH_CONFIG}"
        assert system_config() == system, "up changed the system-wide ssh client config"
        # The nodes' bare addresses are outside the Host block: their keys are unknown.
        launch = [sys.executable, LAUNCH, "-np", "2", "--gloo", "--disable-cache"]
        refused = subprocess.run([*launch, "-H", "10.213.57.11:1,10.213.57.12:1", "true"], capture_output=True,
                                 text=True, timeout=120, env=launch_env())
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert "ssh 10.213.57.11 true failed with your own host-key checking on" in refused.stderr
        assert "Host key verification failed" in refused.stderr, refused.stderr
        by_name = subprocess.run([*launch, "-H", "edge-a:1,edge-b:1", "true"], capture_output=True, text=True,
                                 timeout=120, env=launch_env())
        assert by_name.returncode == 0, (by_name.stdout, by_name.stderr)
    finally:
        cluster("down", timeout=120)
    assert {h: options(h) for h in NODES + OTHERS} == before, "down left ssh options changed"
