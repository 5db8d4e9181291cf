"""The keyed exchange (``hvd_gradpart.compressors.keyed``): its pure parts in one process, the
exchange itself on two ranks and, in the whole suite, on three under MPI."""
import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from conftest import horovodrun
from hvd_gradpart import KeyedCompressor, KeyedResearch, elastic, fused, stats
from hvd_gradpart.compressors import keyed

hvd.init()


@pytest.mark.parametrize("size, want", [(0, 0), (1, 1), (7, 7), (8, 8), (9, 9), (17, 18), (100, 104),
                                        (1000, 1024), (1025, 1152)])
def test_bucket_rounds_up_by_an_eighth_of_the_octave(size, want):
    assert int(keyed.bucket(tf.constant(size))) == want


def test_capped_keeps_the_largest_ascending():
    indices = tf.constant([0, 1, 3, 4, 5])
    magnitude = lambda i: tf.gather(tf.constant([0.5, 3.0, 0.1, 2.0, 0.9, 4.0]), i)
    np.testing.assert_array_equal(keyed.capped(indices, magnitude, 2).numpy(), [1, 5])
    np.testing.assert_array_equal(keyed.capped(indices, magnitude, 9).numpy(), [0, 1, 3, 4, 5])


@pytest.mark.parametrize("wire", [tf.float16, tf.float32])
def test_pack_and_unpack_every_ranks_nominations(wire):
    blocks = [keyed.pack(tf.constant([3, 9, 64]), tf.constant([0.5, -2.0, 0.0], wire)),
              keyed.pack(tf.constant([1, 64, 64]), tf.constant([4.0, 0.0, 0.0], wire))]
    positions, values = keyed.unpack(tf.concat(blocks, 0), 3, wire)
    np.testing.assert_array_equal(positions.numpy(), [3, 9, 64, 1, 64, 64])
    np.testing.assert_array_equal(values.numpy(), [0.5, -2.0, 0.0, 4.0, 0.0, 0.0])


@pytest.mark.parametrize("beta", [1.0, 2.0])
def test_moments_give_the_fit_of_the_sample(beta):
    rng = np.random.RandomState(0)
    x = (rng.laplace(size=200_000) if beta == 1.0 else rng.randn(200_000)).astype(np.float32) * 0.01
    fit = keyed.fitted(*tf.unstack(tf.cast(keyed.moments(tf.constant(x), 100_000), tf.float64)))
    assert abs(float(fit.beta) - beta) < 0.1
    reference = stats.fit(tf.constant(x[::2]), stats.LAPLACE if beta == 1.0 else stats.GAUSSIAN)
    assert abs(float(fit.alpha) / float(reference.alpha) - 1) < 0.05


def test_sweep_marks_the_predicted_accumulation_and_the_candidates_outside_it():
    rate = tf.constant([0.1, -2.0, 0.0, np.inf, 0.5, 0.0, 0.0, 0.0, 9.0], tf.float32)  # [8]: the spare
    last = tf.constant([0.0, 3.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0], tf.float32)
    grad = tf.constant([0.0, 5.0, 1.5, 0.0, 0.0, -2.0, np.nan, 0.1], tf.float32)
    acc, key, candidates = keyed._sweep.python_function(tf.zeros([8]), grad, rate, last, 4.0, 0.9, 1.0)
    # |-2 * 1|, inf and |0.5 * 2| pass 0.9, |0.1 * 4| does not; outside them |acc| > 1, and the NaN
    np.testing.assert_array_equal(fused.compact(key).indices.numpy(), [1, 3, 4])
    np.testing.assert_array_equal(fused.compact(candidates).indices.numpy(), [2, 5, 6])


def test_one_process_round_trip_keeps_error_feedback_exact():
    comp = KeyedCompressor()
    step = tf.function(lambda g: comp.decompress(*comp.compress(g)))
    rng = np.random.RandomState(1)
    total_in, total_out = np.zeros(4096), np.zeros(4096)
    for _ in range(12):
        g = rng.randn(64, 64).astype(np.float32)
        total_in += g.ravel()
        total_out += step(tf.constant(g)).numpy().ravel()
    residual = next(iter(comp.memory.slots.values())).residual.numpy()
    np.testing.assert_allclose(total_out + residual, total_in, rtol=1e-5, atol=1e-4)
    assert 0 < np.count_nonzero(total_out) < 4096


@pytest.mark.parametrize("make", [lambda: KeyedCompressor(density_ceiling=0),
                                  lambda: KeyedCompressor(density_ceiling=True),
                                  lambda: KeyedResearch(nominate=0), lambda: KeyedResearch(margin=-1.0),
                                  lambda: KeyedResearch(sample_size=4)])
def test_invalid_settings_name_the_argument(make):
    with pytest.raises(ValueError, match="density_ceiling|nominate|margin|sample_size"):
        make()


def test_two_ranks_exact_nan_disagreement_and_grouped_training():
    out = horovodrun("keyed_check.py", np=2, timeout=400)
    for line in ("exact under", "an Inf on one rank makes", "trains in a group", "a disagreement stopped"):
        assert line in out, out[-3000:]


@pytest.mark.slow
def test_three_ranks_under_mpi():
    out = horovodrun("keyed_check.py", np=3, backend="mpi", timeout=600)
    assert out.count("a disagreement stopped") >= 1 and "trains in a group" in out, out[-3000:]


def test_an_elastic_reset_restarts_the_shared_state_and_keeps_the_residual():
    comp = KeyedCompressor()
    step = tf.function(lambda g: comp.decompress(*comp.compress(g)))
    rng = np.random.RandomState(2)
    for _ in range(4):
        step(tf.constant(rng.randn(4096).astype(np.float32)))
    slot = next(iter(comp.memory.slots.values()))
    residual = slot.residual.numpy().copy()
    assert np.any(slot.state["rate"].numpy() != 0)
    elastic.CompressorState(comp).restart_shared()
    np.testing.assert_array_equal(slot.state["rate"].numpy(), np.zeros(4097))
    np.testing.assert_array_equal(slot.state["last"].numpy(), np.zeros(4097))
    assert slot.state["prediction"].numpy()[3] == 0.0
    np.testing.assert_array_equal(slot.residual.numpy(), residual)
