"""benchmarks/simulate.py: W simulated workers apply the average of their
compressors' selections (the marker handed to ``decompress`` scales each by 1/W)."""
import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from benchmarks import simulate
from hvd_gradpart import TopKCompressor

hvd.init()


def _one_step(compressors, workers=2):
    """Weights after one plain-SGD step (rate 1) of a tiny model from fixed weights."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((8,)), tf.keras.layers.Dense(200)])
    before = [v.numpy() for v in model.trainable_variables]
    step = simulate.make_step(model, tf.keras.optimizers.SGD(1.0), compressors, workers)
    rng = np.random.default_rng(1)
    xs = tf.constant(rng.normal(size=(workers, 4, 8)), tf.float32)
    ys = tf.constant(rng.integers(0, 10, size=(workers, 4)), tf.int32)
    step(xs, ys)
    return [b - v.numpy() for b, v in zip(before, model.trainable_variables)]


def test_workers_apply_the_average_of_their_selections():
    dense = _one_step([])
    # ratio 1 sends every element: the sum of the decompressed selections must be the average.
    sparse = _one_step([TopKCompressor(ratio=1.0, min_elements=0) for _ in range(2)])
    for d, s in zip(dense, sparse):
        np.testing.assert_allclose(s, d, rtol=1e-5, atol=1e-7)
        assert np.abs(d).max() > 0


def test_a_method_that_sums_inside_compress_is_refused_with_what_to_run():
    simulate.check_simulable([("topk", "topk", {}), ("gradpart", "gradpart", {})], "mlp", 2)
    for run in [("powersgd", "powersgd", {}), ("key", "gradpart", {"spectral": True})]:
        with pytest.raises(SystemExit, match=r"cannot simulate.*benchmarks.tta --local --models mlp"):
            simulate.check_simulable([run], "mlp", 2)
