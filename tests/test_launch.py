"""scripts/launch.py: host names checked before horovodrun, failures named by rank and host."""
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launch_env

sys.path.insert(0, str(Path(__file__).parents[1] / "scripts"))
import launch  # noqa: E402

LAUNCH = Path(launch.__file__)
ROOT = LAUNCH.parents[1]


def test_shipped_hostfiles_pass_and_map_ranks_like_horovod():
    hosts = launch.read_hosts(hostfile=ROOT / "hostfiles" / "edge")
    assert hosts == "edge-a:1,edge-b:1"
    assert launch.rank_hosts(hosts, 2) == {0: "edge-a", 1: "edge-b"}
    assert launch.rank_hosts(launch.read_hosts("a:2,b:1"), 3) == {0: "a", 1: "a", 2: "b"}


@pytest.mark.parametrize("hosts, says", [
    ("edge-a", "expected HOST:SLOTS"),
    ("edge-a:x", "expected HOST:SLOTS"),
    ("-oProxyCommand=x:1", "invalid host name"),
    ("edge a:1", "invalid host name"),
])
def test_bad_host_entries_are_named(hosts, says):
    with pytest.raises(launch.HostError, match=says):
        launch.read_hosts(hosts)


def test_failure_line_names_the_first_rank_and_its_host():
    output = ["Process 1 exit with status code 255.", "Process name: 1", "Exit code: 255"]
    line = launch.failure_line(output, {0: "edge-a", 1: "edge-b"})
    assert line.startswith("launch.py: error: rank 1 on edge-b failed first (exit 255: its ssh connection")
    assert "before any rank exited" in launch.failure_line(["ValueError: bad"], {0: "a"})


DIES = """
import os, time
if os.environ["HOROVOD_RANK"] == "1":
    os._exit(3)
time.sleep(120)
"""


def test_a_rank_that_dies_ends_the_launch_naming_it(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(DIES)
    done = subprocess.run([sys.executable, str(LAUNCH), "-np", "2", "-H", "localhost:2", "--gloo",
                           sys.executable, str(script)], capture_output=True, text=True, timeout=100,
                          env=launch_env())
    assert done.returncode != 0
    assert done.stderr.strip().splitlines()[-1] == (
        "launch.py: error: rank 1 on localhost failed first (exit 3); Horovod stopped the other ranks")
