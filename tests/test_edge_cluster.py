"""The two-node edge cluster on one machine (``scripts/edge_cluster.sh``).

Brings the cluster up once for the module and always down at the end, so the machine is left
as it was found. Needs root and permission to create network namespaces; skipped (loudly)
without them.
"""
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.cluster

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "edge_cluster.sh"
STATE_DIR = Path("/run/hvd_gradpart_edge")
HOSTS = Path("/etc/hosts")
SSH_DIR = Path(pwd.getpwuid(0).pw_dir) / ".ssh"
SSH_CONFIG = SSH_DIR / "config"
AUTH_KEYS = SSH_DIR / "authorized_keys"
BEGIN = "# hvd_gradpart edge cluster BEGIN"
END = "# hvd_gradpart edge cluster END"
KEY_COMMENT = "hvd_gradpart-edge-cluster"
NODES = {"edge-a": "10.213.57.11", "edge-b": "10.213.57.12"}
IFACE = "gpbr0"  # each node's interface is named like the bridge (Horovod needs a common name)
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5"]

# Echo server / sink for TCP between the namespaces (run with `ip netns exec`).
TCP_PEER = r"""
import socket, sys, time
mode, host, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((host, port)); s.listen(1); print("ready", flush=True)
    s.settimeout(30); c, _ = s.accept(); c.settimeout(30); got = 0
    while got < n:
        b = c.recv(1 << 16)
        if not b: break
        got += len(b)
    c.sendall(str(got).encode()); c.close()
else:
    t0 = time.time(); c = socket.create_connection((host, port), timeout=10)
    c.sendall(b"x" * n); c.shutdown(socket.SHUT_WR); reply = c.recv(64)
    print(reply.decode(), round(time.time() - t0, 3))
"""


def _skip_reason():
    if os.geteuid() != 0:
        return "not running as root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"hvdgp-test-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` is not permitted here ({r.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


_WHY = _skip_reason()
if _WHY:
    pytest.skip(f"EDGE CLUSTER TESTS SKIPPED: {_WHY}; the two-node cluster cannot be built on "
                "this machine, so two-node runs must fall back to hostfiles/localhost",
                allow_module_level=True)


def sh(*cmd, check=True, timeout=60, **kw):
    """Runs ``cmd``; returns the CompletedProcess (text). Fails the test on error if ``check``."""
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, **kw)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {done.returncode}:\n"
                    f"{done.stdout}\n{done.stderr}")
    return done


def cluster(*args, check=True, **kw):
    return sh("bash", SCRIPT, *args, check=check, **kw)


def cluster_for_module(label, nodes=2):
    """A module-scoped fixture: ``nodes`` nodes up at 100 Mbit/s for one test module, down after it.

    A cluster that is already up belongs to someone else: the module is skipped, loudly.
    """
    @pytest.fixture(scope="module")
    def edge():
        if "up" in cluster("status", check=False).stdout and cluster("counters", check=False).returncode == 0:
            pytest.skip(f"{label} SKIPPED: an edge cluster is already up; not touching it")
        cluster("up", "--nodes", str(nodes), "--rate", "100mbit", timeout=120)
        yield
        cluster("down", timeout=120)

    return edge


def netns_names():
    return {line.split()[0] for line in sh("ip", "netns", "list").stdout.splitlines() if line}


def link_names():
    return {m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", sh("ip", "-o", "link").stdout, re.M)}


def read(path):
    return path.read_text() if path.exists() else None


def our_sshd_pids():
    """Live (non-zombie) processes running an sshd with the cluster's config."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(STATE_DIR / "sshd_config") in cmdline and state != "Z":
            pids.append(int(proc.name))
    return pids


def counters():
    out = cluster("counters").stdout
    data = json.loads(out)
    assert set(data) == set(NODES), out
    for node in data.values():
        assert set(node) == {"tx_bytes", "rx_bytes"}, out
        assert all(isinstance(v, int) and v >= 0 for v in node.values()), out
    return data


def tc_rate(node):
    out = sh("tc", "-n", node, "qdisc", "show", "dev", IFACE).stdout
    m = re.search(r"qdisc tbf \S+ root .*?rate (\S+)", out)
    assert m, f"no tbf qdisc on {node}/{IFACE}:\n{out}"
    return m.group(1)


def tcp_transfer(src, dst, nbytes, port=5599):
    """Sends ``nbytes`` over TCP from namespace ``src`` to ``dst``; returns seconds taken."""
    server = subprocess.Popen(["ip", "netns", "exec", dst, sys.executable, "-c", TCP_PEER,
                               "serve", NODES[dst], str(port), str(nbytes)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout.readline().strip() == "ready", server.stderr.read()
        out = sh("ip", "netns", "exec", src, sys.executable, "-c", TCP_PEER,
                 "send", NODES[dst], port, nbytes).stdout.split()
        assert int(out[0]) == nbytes, out
        return float(out[1])
    finally:
        server.wait(timeout=30)


def no_cluster_up():
    if STATE_DIR.exists():
        pytest.skip(f"EDGE CLUSTER ALREADY UP ({STATE_DIR} exists): not touching a cluster "
                    "someone else is using; run `scripts/edge_cluster.sh down` first")


# ---------------------------------------------------------------- before the cluster is up

@pytest.mark.parametrize("args, message", [
    ((), "Usage"),
    (("frobnicate",), "unknown command"),
    (("up", "--bogus"), "unknown option"),
    (("up", "--nodes"), "needs a value"),
    (("up", "--nodes", "0"), "invalid --nodes"),
    (("up", "--nodes", "9"), "invalid --nodes"),
    (("up", "--nodes", "two"), "invalid --nodes"),
    (("up", "--rate", "10mb"), "invalid rate"),
    (("up", "--rate", "0mbit"), "invalid rate"),
    (("up", "--rate", "100mbit; rm -rf /"), "invalid rate"),
    (("up", "--delay", "-5"), "invalid --delay"),
    (("up", "extra"), "takes no arguments"),
    (("rate",), "usage"),
    (("rate", "20MB"), "invalid rate"),
    (("rate", "20mbit", "--nodes", "2"), "only valid with up"),
    (("down", "--rate", "1mbit"), "takes no options"),
    (("counters", "x"), "takes no arguments"),
])
def test_invalid_options_fail_clearly(args, message):
    existed = STATE_DIR.exists()
    done = cluster(*args, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message.lower() in (done.stdout + done.stderr).lower(), done.stderr
    assert STATE_DIR.exists() == existed


def test_refuses_foreign_namespace():
    no_cluster_up()
    assert "edge-a" not in netns_names(), "a namespace edge-a exists before the test"
    hosts_before = read(HOSTS)
    sh("ip", "netns", "add", "edge-a")
    try:
        done = cluster("up", check=False)
        assert done.returncode == 5, (done.stdout, done.stderr)
        assert "network namespace edge-a" in done.stderr and "not created by this script" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "edge-a" in netns_names(), "up deleted a namespace it did not create"
        assert "edge-b" not in netns_names() and not STATE_DIR.exists()
        assert read(HOSTS) == hosts_before
        assert cluster("down", check=False).returncode == 0
        assert "edge-a" in netns_names(), "down deleted a namespace it did not create"
    finally:
        sh("ip", "netns", "del", "edge-a", check=False)


def test_refuses_foreign_hosts_entry():
    no_cluster_up()
    before = read(HOSTS)
    HOSTS.write_text(before + "10.99.99.99\tedge-b\n")
    try:
        done = cluster("up", check=False)
        assert done.returncode == 5, (done.stdout, done.stderr)
        assert "/etc/hosts entry for edge-b" in done.stderr
        assert not netns_names() & set(NODES) and not STATE_DIR.exists()
    finally:
        HOSTS.write_text(before)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) not installed")
@pytest.mark.parametrize("how, message", [
    (["--reuid=65534", "--regid=65534", "--clear-groups"], "must run as root"),
    (["--bounding-set=-sys_admin"], "network namespaces are not permitted"),
])
def test_exit_3_when_namespaces_are_impossible(how, message):
    no_cluster_up()
    done = sh("setpriv", *how, "bash", SCRIPT, "up", check=False)
    assert done.returncode == 3, (done.stdout, done.stderr)
    assert message in done.stderr and "hostfiles/localhost" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not netns_names() & set(NODES) and not STATE_DIR.exists()


def _netem_available():
    probe = f"hvdgp-netem-{os.getpid()}"
    sh("ip", "netns", "add", probe)
    try:
        return sh("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms",
                  check=False).returncode == 0
    finally:
        sh("ip", "netns", "del", probe, check=False)


def test_delay_needs_netem():
    no_cluster_up()
    if _netem_available():
        try:
            cluster("up", "--delay", "10")
            assert "netem" in sh("tc", "-n", "edge-a", "qdisc", "show", "dev", IFACE).stdout
            assert tc_rate("edge-a") == "100Mbit"
        finally:
            cluster("down", check=False)
        return
    done = cluster("up", "--delay", "10", check=False)
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert "netem is not available in this kernel; --delay cannot be applied" in done.stderr
    assert not netns_names() & set(NODES) and not STATE_DIR.exists()


def test_hostfiles_parse_as_horovod_reads_them():
    # Horovod's parse_host_files takes every line as "HOST slots=N": no comments, no blanks.
    for name, want in [("edge", "edge-a:1,edge-b:1"), ("localhost", "localhost:2")]:
        lines = (ROOT / "hostfiles" / name).read_text().splitlines()
        assert all(re.fullmatch(r"\S+ slots=\d+", line) for line in lines), lines
        assert ",".join(f"{line.split()[0]}:{line.split('=')[1]}" for line in lines) == want
    example = (ROOT / "hostfiles" / "two-machines.example").read_text()
    assert "horovodrun" in example and "ssh" in example


# ---------------------------------------------------------------- with the cluster up

@pytest.fixture(scope="module")
def edge():
    """The cluster, up for the tests below; brought down at the end whatever happens."""
    no_cluster_up()
    before = {"hosts": read(HOSTS), "ssh_config": read(SSH_CONFIG),
              "authorized_keys": read(AUTH_KEYS), "netns": netns_names(), "links": link_names()}
    try:
        cluster("up", timeout=120)
        yield before
    finally:
        cluster("down", check=False, timeout=120)


def test_up_builds_two_nodes(edge):
    assert set(NODES) <= netns_names()
    hosts = HOSTS.read_text()
    for node, addr in NODES.items():
        inside = sh("ip", "-n", node, "-4", "-o", "addr", "show", "dev", IFACE).stdout
        assert f"inet {addr}/24" in inside
        assert f"{addr}\t{node}" in hosts
        assert "UP" in sh("ip", "-n", node, "link", "show", "dev", "lo").stdout
    assert hosts.count(BEGIN) == 1 and hosts.count(END) == 1
    config = SSH_CONFIG.read_text()
    assert config.startswith(BEGIN) and config.count(BEGIN) == 1
    block = config.split(END)[0]
    assert re.search(r"^Host edge-a edge-b$", block, re.M), block
    for option in ["IdentityFile", "StrictHostKeyChecking no", "UserKnownHostsFile /dev/null",
                   "LogLevel ERROR", "ServerAliveInterval 5", "ServerAliveCountMax 3"]:
        assert option in block
    # Relaxed host-key checking only inside the edge-* Host block.
    assert "StrictHostKeyChecking" not in config.split(END, 1)[1]
    assert sum(KEY_COMMENT in line for line in AUTH_KEYS.read_text().splitlines()) == 1
    assert Path("/run/sshd").is_dir()


def test_ssh_from_root_and_between_nodes(edge):
    sh(*SSH, "edge-b", "true")
    sh(*SSH, "edge-a", "true")
    sh("ip", "netns", "exec", "edge-a", *SSH, "edge-b", "true")
    sh("ip", "netns", "exec", "edge-b", *SSH, "edge-a", "true")
    seen = sh("ip", "netns", "exec", "edge-a", *SSH, "edge-b", "ip -4 -o addr show dev gpbr0").stdout
    assert f"inet {NODES['edge-b']}/24" in seen
    # Each node's sshd has its own UTS namespace: sessions see the node's name as hostname,
    # and it resolves to the node's address (Gloo needs that; the shared one maps to loopback).
    for node, addr in NODES.items():
        assert sh(*SSH, node, "hostname").stdout.strip() == node
        assert sh(*SSH, node, "getent hosts $(hostname)").stdout.split()[0] == addr


def test_ping_and_tcp_between_nodes(edge):
    if shutil.which("ping"):
        sh("ip", "netns", "exec", "edge-a", "ping", "-c", "2", "-W", "2", NODES["edge-b"])
    tcp_transfer("edge-a", "edge-b", 200_000)
    tcp_transfer("edge-b", "edge-a", 200_000, port=5600)


def test_tc_rate_applied(edge):
    for node in NODES:
        assert tc_rate(node) == "100Mbit"


def test_up_twice_is_idempotent(edge):
    def snapshot():
        return {"state": (STATE_DIR / "state").read_text(), "hosts": read(HOSTS),
                "ssh_config": read(SSH_CONFIG), "authorized_keys": read(AUTH_KEYS),
                "netns": netns_names(), "links": sh("ip", "-o", "link").stdout.count("gpv-"),
                "ifindex": sh("ip", "-o", "link", "show", "dev", "gpbr0").stdout.split(":")[0],
                "rates": {n: tc_rate(n) for n in NODES}, "sshd": sorted(our_sshd_pids())}
    first = snapshot()
    cluster("up")
    assert snapshot() == first


def test_rate_change_mid_run(edge):
    try:
        out = cluster("rate", "20mbit").stdout
        assert "20mbit" in out
        for node in NODES:
            assert tc_rate(node) == "20Mbit"
        assert "20Mbit" in cluster("status").stdout
        # 2.5 MB at 20 Mbit/s takes about 1 s; unshaped it takes a few ms.
        assert tcp_transfer("edge-a", "edge-b", 2_500_000) > 0.6
        cluster("up")  # a plain `up` keeps the rate in force
        assert tc_rate("edge-a") == "20Mbit"
    finally:
        cluster("up", "--rate", "100mbit")
    assert {tc_rate(n) for n in NODES} == {"100Mbit"}


def test_counters_grow_with_traffic(edge):
    before = counters()
    with open(os.devnull, "wb") as null:
        subprocess.run(["ip", "netns", "exec", "edge-a", *SSH, "edge-b", "head -c 1000000 /dev/zero"],
                       stdout=null, check=True, timeout=60)
    after = counters()
    assert after["edge-b"]["tx_bytes"] - before["edge-b"]["tx_bytes"] >= 1_000_000
    assert after["edge-a"]["rx_bytes"] - before["edge-a"]["rx_bytes"] >= 1_000_000
    # The inside end's tx is the root-side peer's rx.
    peer_rx = int(Path("/sys/class/net/gpv-edge-b/statistics/rx_bytes").read_text())
    assert abs(peer_rx - after["edge-b"]["tx_bytes"]) < 100_000


HVD_PROBE = """
import horovod.tensorflow as hvd, socket, tensorflow as tf
hvd.init()
total = hvd.allreduce(tf.fill([1_000_000], float(hvd.rank() + 1)), op=hvd.Sum)
print("RANK", hvd.rank(), hvd.size(), socket.gethostname(), float(total[0]), flush=True)
"""


def test_horovodrun_over_the_cluster(edge, tmp_path):
    horovodrun = Path(sys.executable).with_name("horovodrun")
    if not horovodrun.exists():
        pytest.skip(f"no horovodrun next to {sys.executable}: run the tests from the project venv")
    script = tmp_path / "hvd_probe.py"
    script.write_text(HVD_PROBE)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    before = counters()
    # --disable-cache: horovodrun would otherwise remember this host list's interfaces for an hour.
    done = sh(horovodrun, "-np", 2, "-hostfile", ROOT / "hostfiles" / "edge", "--gloo",
              "--disable-cache", sys.executable, script, timeout=240, env=env, cwd=ROOT)
    ranks = sorted(line.split("RANK", 1)[1].split() for line in done.stdout.splitlines()
                   if "RANK" in line)
    assert ranks == [["0", "2", "edge-a", "3.0"], ["1", "2", "edge-b", "3.0"]], done.stdout
    after = counters()
    for node in NODES:  # a 4 MB ring allreduce moves about 4 MB each way on every node's link
        assert after[node]["tx_bytes"] - before[node]["tx_bytes"] > 3_500_000


def test_status_reports_every_node(edge):
    out = cluster("status").stdout
    for node, addr in NODES.items():
        line = next(line for line in out.splitlines() if line.startswith(node))
        assert addr in line and "up (pid" in line and "100Mbit" in line, out


def test_down_leaves_nothing_behind(edge):
    pids = our_sshd_pids()
    assert len(pids) >= 2
    out = cluster("down").stdout
    assert "down" in out
    assert not netns_names() & set(NODES)
    assert netns_names() == edge["netns"]
    assert not {"gpbr0", "gpv-edge-a", "gpv-edge-b"} & link_names()
    assert link_names() == edge["links"]
    assert read(HOSTS) == edge["hosts"]
    assert read(SSH_CONFIG) == edge["ssh_config"]
    assert read(AUTH_KEYS) == edge["authorized_keys"]
    assert not STATE_DIR.exists()
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    assert our_sshd_pids() == []
    assert cluster("status", check=False).returncode == 1
    assert cluster("counters", check=False).returncode == 1
    # A second down is harmless.
    assert cluster("down").returncode == 0
