"""GradPart's spectral key area in one process: its shapes, its width rule, its pricing, its books.

With one process Horovod's allreduce is the identity, so the key area's sum over ranks is this
rank's own projection; exactness across ranks is tests/parallel/spectral_check.py's.
"""
import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart import GradPartCompressor, GradPartResearch, get_compressor, spectral

hvd.init()


def test_only_matrices_whose_factors_shrink_them_get_a_key_area():
    assert spectral.matrix_shape(tf.TensorShape([784, 1024]), 4) == (784, 1024)
    assert spectral.matrix_shape(tf.TensorShape([3, 3, 16, 32]), 4) == (144, 32)
    assert spectral.matrix_shape(tf.TensorShape([1024]), 4) is None  # a vector
    assert spectral.matrix_shape(tf.TensorShape([30, 10]), 4) is None  # 4 directions: 2 x 4 x 40 > 300 values
    assert spectral.matrix_shape(tf.TensorShape([None, 10]), 1) is None


def width(energies, coordinates, now, cap=4):
    got = spectral.next_width(tf.constant(energies, tf.float64), tf.constant(coordinates, tf.float64),
                              tf.constant(now), tf.constant(cap))
    return [int(x) for x in got]


def test_the_width_counts_the_directions_that_beat_their_coordinates():
    assert width([9.0, 4.0, 1.0], [2.0, 2.0, 2.0], 3) == [2, 2]  # the third loses: shrink, and cap at 2
    assert width([9.0, 4.0, 1.0], [20.0, 9.0, 9.0], 3) == [0, 0]  # none pays: coordinates alone
    assert width([5.0, 4.0], [1.0, 1.0], 2, cap=2) == [2, 2]  # all pay but the cap holds


def test_the_width_grows_only_while_the_spectrum_is_flat():
    assert width([5.0], [1.0], 1) == [2, 4]  # one direction: its spectrum is flat
    assert width([5.0, 4.0], [1.0, 1.0], 2) == [3, 4]  # exp(H) = 1.99 >= 1.5
    assert width([9.0, 0.5], [0.1, 0.1], 2) == [2, 4]  # exp(H) = 1.24: a peaked spectrum stays
    assert width([5.0, 5.0, 5.0, 5.0], [1.0] * 4, 4) == [4, 4]  # max_rank (the cap) reached


def test_coordinate_runs_match_the_sorted_values():
    x = np.random.RandomState(0).standard_t(3, size=3000).astype(np.float32)
    squares = np.sort(x.astype(np.float64) ** 2)[::-1]
    got = spectral.coordinate_runs(tf.constant(x), 3, 100.0).numpy()
    np.testing.assert_allclose(got, [squares[:100].sum(), squares[100:200].sum(), squares[200:300].sum()], rtol=1e-6)
    big = np.random.RandomState(1).randn(400_000).astype(np.float32)  # sampled: an estimate
    got = spectral.coordinate_runs(tf.constant(big), 2, 2000.0).numpy()
    squares = np.sort(big.astype(np.float64) ** 2)[::-1]
    np.testing.assert_allclose(got, [squares[:2000].sum(), squares[2000:4000].sum()], rtol=0.15)


def test_a_direction_pays_for_its_link_time_at_the_sparse_area_s_least_value():
    rs = np.random.RandomState(5)
    g = tf.constant(np.outer(rs.randn(300), rs.randn(50)).astype(np.float32).ravel())
    energy = float(tf.reduce_sum(tf.square(g)))

    def last_width(marginal):  # after Q's warm-up and the first trial
        key = spectral.SpectralKey(300, 50, 4, value_bytes=2, seed=0)
        for _ in range(spectral.TRIAL_EVERY + 2):
            width = key.split(g, tf.zeros_like(g), g, tf.constant(marginal(key), tf.float64)).width
        return int(width)

    assert last_width(lambda key: 0.0) >= 1  # rank one: its direction beats any coordinates
    assert last_width(lambda key: 0.9 * energy / key.bought) >= 1  # and its bytes at that price
    assert last_width(lambda key: 2.0 * energy / key.bought) == 0  # its bytes would carry more as values


def eager_steps(comp, grads):
    """Compress and decompress each gradient eagerly; the outputs' sum."""
    return sum(comp.decompress(*comp.compress(tf.constant(g))).numpy() for g in grads)


@pytest.mark.parametrize("outliers", [False, True])
def test_output_plus_residual_is_input(outliers):
    rs = np.random.RandomState(3)
    low = rs.randn(200, 3) @ rs.randn(3, 60)
    grads = [(low + 0.2 * rs.randn(200, 60)).astype(np.float32) for _ in range(20)]
    comp = GradPartCompressor(research=GradPartResearch(spectral=True, outliers=outliers))
    out = eager_steps(comp, grads)
    slot = next(iter(comp.memory.slots.values()))
    np.testing.assert_allclose(out + slot.residual.numpy().reshape(200, 60), sum(grads), rtol=1e-5, atol=1e-4)
    figures = slot.metrics.read()
    assert figures["rank"] >= 1 and figures["key_bytes"] == figures["rank"] * 4 * (200 + 60 + 2)
    assert figures["sent_bytes"] >= figures["key_bytes"]


def test_a_rank_one_gradient_goes_whole_through_the_key_area():
    rs = np.random.RandomState(4)
    g = np.outer(rs.randn(300), rs.randn(50)).astype(np.float32)
    comp = get_compressor("gradpart", spectral=True, outliers=False, density_floor=0.0)
    for _ in range(3):
        out = comp.decompress(*comp.compress(tf.constant(g))).numpy()
    np.testing.assert_allclose(out, g, atol=1e-5 * np.abs(g).max())
    assert np.abs(next(iter(comp.memory.slots.values())).residual.numpy()).max() <= 1e-5 * np.abs(g).max()


def test_by_default_no_tensor_has_a_key_area():
    comp = GradPartCompressor()
    eager_steps(comp, [np.ones((200, 60), np.float32)])
    assert comp.keys == {}
    assert "rank" not in next(iter(comp.memory.slots.values())).metrics.read()


def test_a_bad_max_rank_names_its_range():
    with pytest.raises(ValueError, match=r"max_rank must be an int >= 1, got 0"):
        GradPartResearch(max_rank=0)


@pytest.mark.parametrize("outliers", [False, True])
def test_nan_in_a_matrix_gives_a_sum_not_finite_and_keeps_the_state(outliers):
    comp = GradPartCompressor(research=GradPartResearch(spectral=True, outliers=outliers))
    g = np.ones((200, 60), np.float32)
    eager_steps(comp, [g])
    slot, key = next(iter(comp.memory.slots.values())), next(iter(comp.keys.values()))
    variables = [slot.residual, key.q, key.width, key.cap]
    before = [v.numpy().copy() for v in variables]
    g[3, 4] = np.nan
    assert not np.isfinite(eager_steps(comp, [g])).all()
    for kept, v in zip(before, variables):
        np.testing.assert_array_equal(v.numpy(), kept, err_msg=v.name)