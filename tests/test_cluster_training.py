"""A real ssh launch of train.py on the two-node namespace cluster.

Checks that both nodes end with identical weights, that the traffic crossed
the link (its kernel counters), and how the compressor's own accounting
compares with those counters.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import launch_env
from test_edge_cluster import _WHY, cluster, cluster_for_module  # noqa: F401  (skips this module with the same loud reason)

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).parents[1]
HOROVODRUN = Path(sys.executable).with_name("horovodrun")


edge = cluster_for_module("CLUSTER TRAINING TEST")


def counters():
    return json.loads(cluster("counters").stdout)


def train(compressor, tmp_path):
    log = tmp_path / f"{compressor}.jsonl"
    env = launch_env()
    before = counters()
    done = subprocess.run(
        [str(HOROVODRUN), "-np", "2", "-hostfile", str(ROOT / "hostfiles" / "edge"), "--gloo",
         "--disable-cache", sys.executable, str(ROOT / "scripts" / "train.py"), "--model", "mlp",
         "--dataset", "digits", "--compressor", compressor, "--epochs", "1", "--jsonl", str(log)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    after = counters()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    digests = dict(re.findall(r"rank (\d) weights sha256 ([0-9a-f]{64})", done.stdout))
    record = json.loads(log.read_text().splitlines()[-1])
    sent = {node: after[node]["tx_bytes"] - before[node]["tx_bytes"] for node in after}
    return digests, record, sent


def test_training_over_the_link(edge, tmp_path):
    dense_digests, _, dense_sent = train("none", tmp_path)
    digests, record, sent = train("gradpart", tmp_path)
    assert len(digests) == 2 and digests["0"] == digests["1"], "nodes ended with different weights"
    assert len(dense_digests) == 2 and dense_digests["0"] == dense_digests["1"]
    comp = record["compression"]
    # Every byte the compressor says edge-a sent crossed edge-a's link (plus Horovod's control
    # traffic and the dense allreduce of the small tensors, which the compressor does not count).
    assert sent["edge-a"] >= comp["total_sent_bytes"] > 0
    # Dense training moves the full gradient through the link every step; GradPart far less, by
    # its own count (a dense probe of the link included) and on the link. The link also carries
    # Horovod's coordination while the first step traces (about 0.3 MB/s, for the 10-30 s that
    # GradPart's first step takes to trace its payload formats, 4 s without compression).
    assert dense_sent["edge-a"] >= comp["total_dense_bytes"]
    assert comp["total_sent_bytes"] * 10 < comp["total_dense_bytes"], comp
    assert sent["edge-a"] * 3 < dense_sent["edge-a"], (sent, dense_sent)
