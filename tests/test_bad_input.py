"""Bad input to a compressor: a clear error, an untouched pass-through, or a non-finite sum as
Horovod's own; never silent damage."""
import horovod.tensorflow as hvd
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart import COMPRESSORS, GradPartCompressor, GradPartResearch, KeyedCompressor, TopKCompressor

hvd.init()
SPARSE = [c for c in COMPRESSORS.values() if hasattr(c, "instance")]


@pytest.mark.parametrize("method", SPARSE)
@pytest.mark.parametrize("tensor", [tf.range(4096), tf.ones([4096], tf.bool), tf.zeros([0]),
                                    tf.constant(2.0), tf.zeros([3])])
def test_ints_bools_empty_scalars_and_small_tensors_pass_through(method, tensor):
    comp = method()
    out, ctx = comp.compress(tensor)
    if isinstance(comp, KeyedCompressor) and tensor.dtype == tf.float32:  # whole, in its float16 wire
        assert out.dtype == tf.float16 and comp.decompress(out, ctx).dtype == tf.float32
        np.testing.assert_array_equal(comp.decompress(out, ctx).numpy(), tensor.numpy())
        return
    assert ctx is None and out is tensor


@pytest.mark.parametrize("method", SPARSE)
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_inf_makes_the_sum_not_finite_and_keeps_the_state(method, bad):
    """As Horovod's dense sum: NaN or Inf in a gradient (a loss scale that overflowed) gives a
    sum that is not finite, raises nothing, and leaves the residual and the method's state as
    they were; the next finite step goes on."""
    comp = method()
    good = tf.constant(np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64))
    step = tf.function(lambda g: comp.decompress(*comp.compress(g)))
    step(good)
    variables = [v for slot in comp.memory.slots.values() for v in slot.rank_local()]
    kept = [v.numpy().copy() for v in variables]
    out = step(tf.tensor_scatter_nd_update(good, [[3, 7]], [bad]))
    assert not np.isfinite(out.numpy()).all()
    for before, v in zip(kept, variables):
        np.testing.assert_array_equal(v.numpy(), before, err_msg=v.name)
    assert np.isfinite(step(good).numpy()).all()


def test_all_zero_gradient_sends_nothing_harmful():
    comp = GradPartCompressor()
    out = comp.decompress(*comp.compress(tf.zeros([8192])))
    np.testing.assert_array_equal(out.numpy(), np.zeros(8192))
    assert float(comp.memory.residual_mass()) == 0.0


@pytest.mark.parametrize("make", [lambda: TopKCompressor(ratio=0), lambda: TopKCompressor(ratio=1.5),
                                  lambda: TopKCompressor(min_elements=-1),
                                  lambda: TopKCompressor(value_encoding="int4"),
                                  lambda: GradPartResearch(prediction_decay=1.0),
                                  lambda: GradPartCompressor(density_ceiling=0.1,
                                                             research=GradPartResearch(density_floor=0.5))])
def test_invalid_hyperparameters_name_the_argument(make):
    with pytest.raises(ValueError, match="ratio|min_elements|value_encoding|prediction_decay|density"):
        make()
