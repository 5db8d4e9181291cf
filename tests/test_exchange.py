"""Single-process checks of the wire format (no Horovod launch needed)."""
import numpy as np
import pytest
import tensorflow as tf

from hvd_gradpart import exchange


def gathered(*selections, encoding="native"):
    """Concatenates payloads as hvd.allgather would (rank order)."""
    return tf.concat([exchange.encode(tf.constant(v), tf.constant(i, tf.int32), encoding).payload
                      for v, i in selections], 0)


def test_decode_sums_every_rank_and_drops_headers():
    rank0 = (np.array([1.5, -2.0], np.float32), [3, 0])
    rank1 = (np.array([0.25], np.float32), [3])
    total = exchange.decode_sum(gathered(rank0, rank1), 5, tf.float32).numpy()
    np.testing.assert_array_equal(total, [-2.0, 0, 0, 1.75, 0])


def test_empty_selection_still_sends_a_header_row():
    payload = exchange.encode(tf.zeros([0], tf.float32), tf.zeros([0], tf.int32)).payload
    assert payload.shape == (1, 8)
    total = exchange.decode_sum(payload, 4, tf.float32).numpy()
    np.testing.assert_array_equal(total, np.zeros(4))


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_round_trip_every_float_dtype(dtype):
    values = tf.constant([0.5, -3.0, 7.0], dtype)
    payload = exchange.encode(values, tf.constant([2, 0, 5])).payload
    assert payload.shape == (4, 4 + dtype.size)
    total = exchange.decode_sum(payload, 6, dtype)
    assert total.dtype == dtype
    np.testing.assert_array_equal(total.numpy().astype(np.float32), [-3, 0, 0.5, 0, 0, 7])


def test_fp16_encoding_rounds_and_reports_what_was_sent():
    values = tf.constant([1.0 + 2 ** -12, 3.0], tf.float32)
    encoded = exchange.encode(values, tf.constant([0, 1]), "fp16")
    np.testing.assert_array_equal(encoded.sent.numpy(), [1.0, 3.0])
    assert encoded.payload.shape == (3, 6)


def test_payload_bytes_counts_rows_header_and_marker():
    assert exchange.payload_bytes(10, tf.float32) == 11 * 8 + 4
    assert exchange.payload_bytes(0, tf.float32, "fp16") == 6 + 4


def test_unknown_encoding_is_refused():
    with pytest.raises(ValueError, match="value_encoding"):
        exchange.wire_dtype(tf.float32, "int8")


def test_headers_that_disagree_stop_the_decode():
    values, indices = tf.constant([1.0]), tf.constant([0])
    payloads = [exchange.encode(values, indices, header_digest=d).payload for d in (exchange.digest("a"), 7)]
    with pytest.raises(tf.errors.InvalidArgumentError, match="ranks packed different things"):
        exchange.decode_sum(tf.concat(payloads, 0), 2, tf.float32, mismatch="ranks packed different things")


def test_decode_applies_the_scale_to_every_value():
    total = exchange.decode_sum(gathered((np.array([2.0, 4.0], np.float32), [1, 0])), 3, tf.float32, scale=0.5)
    np.testing.assert_array_equal(total.numpy(), [2.0, 1.0, 0.0])
