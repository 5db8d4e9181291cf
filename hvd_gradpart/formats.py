"""Where a rank's selected values sit, in the fewest bytes: a position format chosen per payload.

A payload is one flat ``uint8`` tensor: a 9-byte header (int32 ``-1 - digest``, one byte ``b``
naming the format, int32 ``k``, the number of values), the positions, then the ``k`` values in
the wire dtype, in ascending position. With ``b`` in ``GAP_WIDTHS`` each value's position is its
gap from the element after the previous value (the first: from element 0) in a ``b``-bit code; a
gap too long for ``b`` bits is preceded by escape codes ``2 ** b - 1``, each of which advances
``2 ** b - 1`` elements and places no value. Codes are packed least significant bit first and the
last byte is padded with ones (escapes, or less than a code). So ``b = 32`` is one 32-bit word per
value (the int32 rows of before, delta-coded), ``b = 16`` the 16-bit deltas with an escape,
``b = 1`` a position bitmap (bit 0 marks a value, 1 skips an element) that ends at the last value,
and ``b = 0`` (``DENSE``) sends all ``n`` values and no positions (unselected ones are zero).
Every format's size follows from ``n``, ``k`` and the gaps, so ``encode`` computes all of them in
the graph (one ``[k, len(GAP_WIDTHS)]`` division) and writes only the smallest (the first of equal
ones, so equal selections give equal bytes). Decoding gives the same ascending indices and values
whatever the format, so a sum decoded from them does not depend on which format each rank chose.
"""
import tensorflow as tf

HEADER_BYTES = 9
DENSE = 0
GAP_WIDTHS = tuple(range(1, 17)) + (32,)
FORMATS = (DENSE,) + GAP_WIDTHS  # the header's format byte, in order of preference among equals


def name(form):
    """A format's name: ``"dense"`` or ``"gaps<b>"``."""
    return "dense" if form == DENSE else f"gaps{form}"


def _as_bytes(x):
    """``[m]`` tensor -> flat ``[m * itemsize]`` uint8."""
    return tf.reshape(tf.bitcast(x, tf.uint8), [-1])


def _from_bytes(raw, dtype):
    """Flat uint8 -> ``[m]`` tensor of ``dtype``."""
    return tf.bitcast(tf.reshape(raw, [-1, tf.as_dtype(dtype).size]), dtype)


def _ascending(values, indices):
    """``(values, indices)`` in ascending index order (sorted only when they are not)."""
    def order():
        at = tf.argsort(indices, stable=True)
        return tf.gather(values, at), tf.gather(indices, at)

    return tf.cond(tf.reduce_all(indices[1:] > indices[:-1]), lambda: (values, indices), order)


def _gaps(indices):
    """int32 gap of each ascending index from the element after the previous one (the first: from 0)."""
    return indices - tf.concat([tf.zeros([1], tf.int32), indices[:-1] + 1], 0)


def _escape(b):
    """int64 escape code of ``b``-bit codes (``b``: an int32 scalar tensor or an int)."""
    return tf.bitwise.left_shift(tf.constant(1, tf.int64), tf.cast(b, tf.int64)) - 1


def sizes(indices, n, value_bytes):
    """int64 ``[len(FORMATS)]``: each format's payload bytes, header included, for ascending
    distinct ``indices`` of an ``n``-element tensor."""
    k = tf.cast(tf.size(indices), tf.int64)
    gaps = _gaps(indices)
    # Escapes per width, sum(floor(gap / (2 ** b - 1))): a float division is exact here (float32
    # below 2 ** 23 elements: gaps, quotients and their sums stay under 2 ** 24) and much
    # cheaper than an integer one.
    exact = tf.float32 if n <= 2 ** 23 else tf.float64
    escape = tf.constant([2 ** b - 1 for b in GAP_WIDTHS], exact)
    codes = k + tf.cast(tf.reduce_sum(tf.floor(tf.cast(gaps, exact)[:, None] / escape), 0), tf.int64)
    positions = (codes * tf.constant(GAP_WIDTHS, tf.int64) + 7) // 8
    dense = tf.constant([n * value_bytes], tf.int64)
    return HEADER_BYTES + tf.concat([dense, positions + k * value_bytes], 0)


def _pack(b, gaps):
    """The ``b``-bit codes of ``gaps`` (``b``: int32 scalar), as bytes."""
    escape = _escape(b)
    gaps = tf.cast(gaps, tf.int64)
    escapes = gaps // escape
    at = tf.cumsum(escapes) + tf.range(tf.size(gaps, tf.int64))
    codes = tf.tensor_scatter_nd_update(tf.fill([tf.size(gaps, tf.int64) + tf.reduce_sum(escapes)], escape),
                                        at[:, None], gaps - escapes * escape)
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(codes[:, None], tf.range(tf.cast(b, tf.int64))), 1)
    bits = tf.reshape(tf.cast(bits, tf.int32), [-1])
    bits = tf.concat([bits, tf.ones([-tf.size(bits) % 8], tf.int32)], 0)
    return tf.cast(tf.reduce_sum(tf.reshape(bits, [-1, 8]) * tf.constant([1 << j for j in range(8)]), 1), tf.uint8)


def _unpack(b, packed):
    """Ascending int32 indices of ``b``-bit codes in ``packed`` bytes (``b``: int32 scalar)."""
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(packed[:, None], tf.constant(list(range(8)), tf.uint8)), 1)
    bits = tf.reshape(tf.cast(bits, tf.int64), [-1])
    whole = tf.size(bits) // b * b
    weights = tf.bitwise.left_shift(tf.constant(1, tf.int64), tf.range(tf.cast(b, tf.int64)))
    codes = tf.reduce_sum(tf.reshape(bits[:whole], [-1, b]) * weights, 1)
    escape = _escape(b)
    places = codes != escape
    cursor = tf.cumsum(tf.where(places, codes + 1, escape))
    return tf.cast(tf.boolean_mask(cursor - 1, places), tf.int32)


def encode(values, indices, n, header_digest=0, form=None):
    """The payload of ``values`` (already in their wire dtype) at distinct int32 ``indices`` of an
    ``n``-element tensor, in the smallest format (or in ``form``, one of ``FORMATS``).

    Returns:
        ``(payload, format)``: flat uint8 payload, int32 format (``DENSE`` or a gap width).

    Raises:
        tf.errors.InvalidArgumentError: an index repeats.
    """
    if form is not None and form not in FORMATS:
        raise ValueError(f"form must be one of {FORMATS}, got {form!r}")
    values, indices = _ascending(values, indices)
    distinct = tf.debugging.assert_non_negative(_gaps(indices), message="hvd_gradpart: a selected index repeats")
    if form is None:
        with tf.control_dependencies([distinct]):
            form = tf.gather(tf.constant(FORMATS, tf.int32), tf.argmin(sizes(indices, n, values.dtype.size)))
    else:
        form = tf.constant(form, tf.int32)
    body = tf.cond(tf.equal(form, DENSE), lambda: _as_bytes(tf.scatter_nd(indices[:, None], values, [n])),
                   lambda: tf.concat([_pack(form, _gaps(indices)), _as_bytes(values)], 0))
    header = tf.concat([_as_bytes(tf.constant([-1 - header_digest], tf.int32)),
                        tf.cast(form, tf.uint8)[None], _as_bytes(tf.size(indices)[None])], 0)
    return tf.concat([header, body], 0), form


def header(payload):
    """``(int32 -1 - digest, int32 format, int32 k)`` of a payload."""
    tag = _from_bytes(payload[:4], tf.int32)[0]
    return tag, tf.cast(payload[4], tf.int32), _from_bytes(payload[5:HEADER_BYTES], tf.int32)[0]


def decode(payload, n, wire):
    """``(int32 indices, values of dtype wire)`` of one payload of an ``n``-element tensor:
    all ``n`` for ``DENSE``, else ``k``, ascending."""
    wire = tf.as_dtype(wire)
    _, form, k = header(payload)
    body = payload[HEADER_BYTES:]
    dense = tf.equal(form, DENSE)
    count = tf.where(dense, n, k)
    positions = tf.size(body) - count * wire.size
    indices = tf.cond(dense, lambda: tf.range(n), lambda: _unpack(form, body[:positions]))
    return indices, _from_bytes(body[positions:], wire)
