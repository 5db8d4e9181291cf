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


def test_payload_bytes_counts_rows_header_row_count_and_marker():
    assert exchange.payload_bytes(10, tf.float32) == 11 * 8 + 4 + 4
    assert exchange.payload_bytes(0, tf.float32, "fp16") == 6 + 4 + 4
    assert exchange.payload_bytes(0, tf.float32, "fp16", opens_group=True) == 6 + 4 + 4 + 4


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


@pytest.fixture(autouse=True)
def no_open_eager_group():
    """A test that fails between queueing and gathering must not leave payloads to the next."""
    exchange._EAGER.group = None


class TwoRanks:
    """Stands in for ``hvd`` in ``exchange``: rank 1's block is built by ``other`` before the gather."""

    def __init__(self, other):
        self.other = other

    def size(self):
        return 2

    def allgather(self, block):
        return tf.concat([block, self.other()], 0)


def encoded(selections, encoding="native"):
    """``(payload, header digest)`` of each ``(values, indices)`` pair."""
    out = []
    for i, (values, indices) in enumerate(selections):
        header = exchange.digest(f"{i}/{np.asarray(values).dtype}")
        out.append((exchange.encode(tf.constant(values), tf.constant(indices, tf.int32), encoding, header),
                    header))
    return out


def queue(selections):
    """Queues the pairs on one group; returns their tickets."""
    return [exchange.enqueue(e.payload, header, f"gradient {i}") for i, (e, header) in enumerate(encoded(selections))]


def rank_block(selections):
    """The block a second rank would send for ``selections``."""
    pairs = encoded(selections)
    return lambda: exchange.pack([e.payload for e, _ in pairs], exchange.group_tag([h for _, h in pairs]))


MIXED0 = [(np.array([1.5, -2.0], np.float16), [3, 0]), (np.array([], np.float64), []),
          (np.array([0.25, 4.0, -1.0], np.float32), [5, 1, 2])]
MIXED1 = [(np.array([0.5], np.float16), [3]), (np.array([7.0], np.float64), [2]),
          (np.array([], np.float32), [])]


def test_one_gather_carries_a_mixed_group_and_every_rank_gets_its_rows(monkeypatch):
    monkeypatch.setattr(exchange, "hvd", TwoRanks(rank_block(MIXED1)))
    tickets = queue(MIXED0)
    assert len({id(t.group) for t in tickets}) == 1
    sizes = (4, 3, 6)
    totals = [exchange.decode_sum(t.rows(), n, np.asarray(v).dtype).numpy()
              for t, n, (v, _) in zip(tickets, sizes, MIXED0)]
    np.testing.assert_array_equal(totals[0], [-2.0, 0, 0, 2.0])
    np.testing.assert_array_equal(totals[1], [0, 0, 7.0])
    np.testing.assert_array_equal(totals[2], [0, 4.0, -1.0, 0, 0, 0.25])
    assert [t.rows().shape[0] for t in tickets] == [2 + 3, 1 + 2, 4 + 1]


def test_a_gathered_group_is_closed_and_the_next_payload_opens_another(monkeypatch):
    monkeypatch.setattr(exchange, "hvd", TwoRanks(rank_block(MIXED1[:1])))
    first = queue(MIXED0[:1])[0]
    first.rows()
    second = queue(MIXED0[:1])[0]
    assert second.group is not first.group and second.position == 0


def test_ranks_whose_groups_differ_stop_before_reading_counts(monkeypatch):
    monkeypatch.setattr(exchange, "hvd", TwoRanks(rank_block(MIXED1[:1])))
    tickets = queue(MIXED0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="ranks disagree on the 3 gradient"):
        tickets[0].rows()


def test_one_trace_unpacks_any_number_of_ranks():
    """Elastic training changes the number of ranks under a traced step: the walk over the
    gathered blocks takes it as the graph runs, so one trace serves 3 ranks, then 2."""
    tag = exchange.group_tag([h for _, h in encoded(MIXED0)])
    widths = [int(e.payload.shape[1]) for e, _ in encoded(MIXED0)]
    blocks = [exchange.pack([e.payload for e, _ in encoded(sel)], tag) for sel in (MIXED0, MIXED1, MIXED0)]
    walk = tf.function(lambda everyone, size: exchange.unpack(everyone, widths, tag, "disagree", size),
                       input_signature=[tf.TensorSpec([None], tf.uint8), tf.TensorSpec([], tf.int32)])
    for size in (3, 2):
        parts = walk(tf.concat(blocks[:size], 0), tf.constant(size))
        expected = [tf.concat([encoded(sel)[i][0].payload for sel in (MIXED0, MIXED1, MIXED0)[:size]], 0)
                    for i in range(len(widths))]
        unrolled = exchange.unpack(tf.concat(blocks[:size], 0), widths, tag, "disagree", size)  # a known size
        for got, want, same in zip(parts, expected, unrolled):
            np.testing.assert_array_equal(got.numpy(), want.numpy())
            np.testing.assert_array_equal(same.numpy(), want.numpy())
    assert walk.experimental_get_tracing_count() == 1
