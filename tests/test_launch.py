"""scripts/launch.py: host names checked before horovodrun, failures named by rank and host."""
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launch_env

pytestmark = pytest.mark.slow  # launches horovodrun: the whole suite (`make test-all`), not the fast tier

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


def test_horovod_defaults_fill_only_what_the_user_left_unset():
    env, applied = launch.child_env({"PATH": "/bin"})
    assert applied == launch.HOROVOD_DEFAULTS and env == {"PATH": "/bin", **launch.HOROVOD_DEFAULTS}
    mine = {name: "7" for name in launch.HOROVOD_DEFAULTS}
    assert launch.child_env(mine) == (mine, {})
    for off in ({launch.SWITCH: "0"}, {"HOROVOD_AUTOTUNE": "1"}):
        assert launch.child_env(off) == (off, {})
    assert launch.child_env({}, autotune=True) == ({}, {})


def test_horovodrun_flags_win_over_the_defaults(monkeypatch):
    from horovod.runner.common.util import config_parser
    from horovod.runner.launch import parse_args
    monkeypatch.setattr(sys, "argv", ["horovodrun", "-np", "2", "--cycle-time-ms", "3", "--cache-capacity", "5",
                                      "--fusion-threshold-mb", "1", "python", "x.py"])
    env, _ = launch.child_env({})
    config_parser.set_env_from_args(env, parse_args())
    assert (env["HOROVOD_CYCLE_TIME"], env["HOROVOD_CACHE_CAPACITY"], env["HOROVOD_FUSION_THRESHOLD"]) == \
        ("3.0", "5", str(1 << 20))


SHOWS = """
import os
print("SEES", os.environ["HOROVOD_RANK"], *(os.environ.get(k, "-") for k in sorted(%r)), flush=True)
"""


def test_ranks_see_the_defaults_and_launch_says_so(tmp_path):
    script = tmp_path / "shows.py"
    script.write_text(SHOWS % sorted(launch.HOROVOD_DEFAULTS))
    env = {k: v for k, v in launch_env().items() if k not in launch.HOROVOD_DEFAULTS}
    done = subprocess.run([sys.executable, str(LAUNCH), "-np", "2", "-H", "localhost:2", "--gloo",
                           sys.executable, str(script)], capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    values = [launch.HOROVOD_DEFAULTS[k] for k in sorted(launch.HOROVOD_DEFAULTS)]
    seen = sorted(line.split("SEES ", 1)[1].split() for line in done.stdout.splitlines() if "SEES " in line)
    assert seen == [["0", *values], ["1", *values]], done.stdout
    assert "launch.py: Horovod settings " in done.stderr



def test_train_py_applies_the_defaults_when_horovodrun_starts_it_directly(tmp_path):
    env = {k: v for k, v in launch_env().items() if k not in launch.HOROVOD_DEFAULTS}
    settings = " ".join(f"{k}={v}" for k, v in launch.HOROVOD_DEFAULTS.items())
    run = subprocess.Popen([sys.executable, str(LAUNCH.with_name("train.py")), "--model", "mlp", "--dataset",
                            "digits", "--jsonl", str(tmp_path / "run.jsonl")],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        seen = []
        for line in run.stdout:  # training itself is not needed: stop at the line after rank 0's first
            seen.append(line)
            if len(seen) > 1 and seen[-2].startswith("train.py: ranks") or len(seen) > 200:
                break
    finally:
        run.kill()
        run.wait()
    assert seen and seen[-1].startswith(f"train.py: Horovod settings {settings} ("), "".join(seen)[-3000:]
