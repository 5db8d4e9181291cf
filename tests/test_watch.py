"""The figures a user watches: ``rates`` by hand, ``CompressionLogger`` in one process and under
``horovodrun`` in Keras ``fit`` (rank 0's logs, History and TensorBoard; nothing on rank 1)."""
import json
import math

import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from conftest import horovodrun
from hvd_gradpart import CompressionLogger, TopKCompressor, figures
from hvd_gradpart.metrics import Totals, rates, totals


def test_rates_cover_the_steps_between_two_readings():
    before = Totals(dense_bytes=4000, sent_bytes=100, elements=1000, sent_elements=10, dense_steps=1,
                    sparse_steps=9, link_mbit=50.0, follows_link=True)
    now = Totals(dense_bytes=12000, sent_bytes=300, elements=3000, sent_elements=70, dense_steps=4,
                 sparse_steps=13, link_mbit=80.0, follows_link=True)
    assert rates(now, before) == {"gp_ratio": 8000 / 200, "gp_density": 60 / 2000, "gp_dense_share": 3 / 7,
                                  "gp_link_mbit": 80.0}
    assert rates(now) == {"gp_ratio": 40.0, "gp_density": 70 / 3000, "gp_dense_share": 4 / 17, "gp_link_mbit": 80.0}
    idle = rates(now, now)
    assert math.isnan(idle["gp_ratio"]) and math.isnan(idle["gp_density"]) and math.isnan(idle["gp_dense_share"])
    assert rates(now._replace(follows_link=False)).keys() == {"gp_ratio", "gp_density"}


def test_horovods_dense_compressors_have_no_figures():
    assert figures(hvd.Compression.none) == {} and figures(hvd.Compression.fp16) == {}
    assert totals(hvd.Compression.fp16) is None


def test_the_logger_puts_each_epochs_figures_into_rank_0s_logs_only():
    compressor = TopKCompressor(ratio=0.01)
    small, large = tf.ones([2048]), tf.random.stateless_normal([8192], seed=[1, 2])
    first, other = CompressionLogger(compressor, rank=0), CompressionLogger(compressor, rank=1)
    epochs = []
    for grads in ([small], [large, large]):  # the second epoch's figures must not include the first's
        for logger in (first, other):
            logger.on_epoch_begin(len(epochs))
        for g in grads:
            compressor.compress(g)
        logs, quiet = {"loss": 1.0}, {"loss": 1.0}
        first.on_epoch_end(len(epochs), logs)
        other.on_epoch_end(len(epochs), quiet)
        assert quiet == {"loss": 1.0}
        epochs.append(logs)
    assert epochs[0]["gp_density"] == math.ceil(0.01 * 2048) / 2048
    assert epochs[1]["gp_density"] == math.ceil(0.01 * 8192) / 8192
    counts = {key: slot.metrics.read() for key, slot in compressor.memory.slots.items()}
    large_counts = next(c for c in counts.values() if c["elements"] == 8192)
    assert epochs[1]["gp_ratio"] == large_counts["total_dense_bytes"] / large_counts["total_sent_bytes"]
    assert 20 < epochs[0]["gp_ratio"] < 100 and epochs[0]["loss"] == 1.0
    assert figures(compressor)["gp_density"] == (21 + 2 * 82) / (2048 + 2 * 8192)  # since training began


def results(output):
    """``[(compression, rank, result)]`` from the ``RESULT {json}`` lines of a launch."""
    found = []
    for line in output.splitlines():
        if "RESULT " in line:
            result = json.JSONDecoder().raw_decode(line.split("RESULT ", 1)[1])[0]
            found.append((result["compression"], result["rank"], result))
    return found


@pytest.mark.slow
def test_keras_fit_shows_the_figures_on_rank_0(tmp_path):
    output = horovodrun("watch_client.py", args=["--workdir", str(tmp_path)], timeout=180)
    found = {(name, rank): r for name, rank, r in results(output)}
    assert set(found) == {(n, r) for n in ("topk", "gradpart") for r in (0, 1)}, output[-4000:]
    for name in ("topk", "gradpart"):
        assert not [k for k in found[name, 1]["history"] if k.startswith("gp_")], found[name, 1]
        history, sizes = found[name, 0]["history"], found[name, 0]["sizes"]
        assert len(history["gp_ratio"]) == len(history["loss"]) == 2
        assert all(r > 1 for r in history["gp_ratio"]) and all(0 < d <= 1 for d in history["gp_density"]), history
        assert {"epoch_gp_ratio", "epoch_gp_density"} <= set(found[name, 0]["tags"]), found[name, 0]["tags"]
        # Both epochs offer the same bytes, so the run's ratio is the harmonic mean of the epochs' own.
        run = 2 / sum(1 / r for r in history["gp_ratio"])
        assert run == pytest.approx(found[name, 0]["run_ratio"], rel=1e-9), (history, found[name, 0]["run_ratio"])
    topk = found["topk", 0]["history"]
    compressed = [n for n in found["topk", 0]["sizes"] if n >= 1024]
    assert topk["gp_density"] == [sum(math.ceil(0.01 * n) for n in compressed) / sum(compressed)] * 2
    assert "gp_dense_share" not in topk
    gradpart = found["gradpart", 0]["history"]
    assert all(0 <= s <= 1 for s in gradpart["gp_dense_share"]), gradpart
    assert all(np.isnan(m) or m > 0 for m in gradpart["gp_link_mbit"]), gradpart
    progress = [line for line in output.splitlines() if line.startswith("[0]<stdout>:") and " loss: " in line]
    assert len(progress) == 4 and all(" - gp_ratio: " in line for line in progress), progress
