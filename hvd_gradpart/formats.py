"""Payload formats: where a rank's selected values sit, in the fewest bytes.

A payload is one flat ``uint8`` tensor: a 9-byte header (int32 ``-1 - digest``, one byte ``b``
naming the format, int32 ``k``, the number of values), the positions, then the ``k`` values in
the wire dtype, in ascending position. With ``b`` in ``GAP_WIDTHS`` each value's position is its
gap from the element after the previous value (the first: from element 0) in a ``b``-bit code; a
gap too long for ``b`` bits is preceded by escape codes ``2 ** b - 1``, each of which advances
``2 ** b - 1`` elements and places no value. Codes are packed least significant bit first and the
last byte is padded with ones (escapes, or less than a code); each code is written into and read
from the (at most two) little-endian 32-bit words it touches, so packing and unpacking are a few
32-bit operations per code, whatever ``b``. So ``b = 32`` is one 32-bit word per
value (the int32 rows of before, delta-coded), ``b = 16`` the 16-bit deltas with an escape,
``b = 1`` a position bitmap (bit 0 marks a value, 1 skips an element) that ends at the last value,
and ``b = 0`` (``DENSE``) sends all ``n`` values and no positions (unselected ones are zero).
Every format's size follows from ``n``, ``k`` and the gaps, so ``encode`` prices all of them in
the graph (one division of the gaps by the escape codes: exact up to ``SAMPLE`` values, from a
strided sample of the gaps beyond) and writes the cheapest (the first of equal ones, so equal
selections give equal bytes); what a payload counts is always its actual size. Decoding gives
the same ascending indices and values whatever the format, so a sum decoded from them does not
depend on which format each rank chose.
"""
import tensorflow as tf

HEADER_BYTES = 9
DENSE = 0
GAP_WIDTHS = tuple(range(1, 17)) + (32,)
FORMATS = (DENSE,) + GAP_WIDTHS  # the header's format byte, in order of preference among equals
WORD_GAPS = 32  # one 32-bit gap per value: the format of a payload too small to price
SAMPLE = 4096  # gaps that price the formats: all up to this many, else a strided sample


def name(form):
    """A format's name: ``"dense"`` or ``"gaps<b>"``."""
    return "dense" if form == DENSE else f"gaps{form}"


def _as_bytes(x):
    """``[m]`` tensor -> flat ``[m * itemsize]`` uint8."""
    return tf.reshape(tf.bitcast(x, tf.uint8), [-1])


def _from_bytes(raw, dtype):
    """Flat uint8 -> ``[m]`` tensor of ``dtype``."""
    return tf.bitcast(tf.reshape(raw, [-1, tf.as_dtype(dtype).size]), dtype)


def _gaps(indices):
    """int32 gap of each ascending index from the element after the previous one (the first: from 0)."""
    return indices - tf.concat([tf.zeros([1], tf.int32), indices[:-1] + 1], 0)


def _escape(b):
    """uint32 escape code of ``b``-bit codes, ``2 ** b - 1`` (``b``: an int32 scalar tensor or an int, 1 to 32)."""
    return tf.bitwise.right_shift(tf.constant(0xFFFFFFFF, tf.uint32), tf.cast(32 - b, tf.uint32))


def sizes(indices, n, value_bytes, sample=SAMPLE):
    """int64 ``[len(FORMATS)]``: each format's payload bytes, header included, for ascending
    distinct ``indices`` of an ``n``-element tensor: exact for up to ``sample`` indices; beyond,
    the escapes are estimated from a strided sample of the gaps (what a payload then counts
    is its actual size)."""
    k = tf.cast(tf.size(indices), tf.int64)
    gaps = _gaps(indices)
    picked = gaps[::tf.maximum((tf.size(gaps) + sample - 1) // sample, 1)]
    # Escapes per width, sum(floor(gap / (2 ** b - 1))): a float division is exact here (float32
    # below 2 ** 23 elements: gaps, quotients and their sums stay under 2 ** 24) and much
    # cheaper than an integer one.
    exact = tf.float32 if isinstance(n, int) and n <= 2 ** 23 else tf.float64
    escape = tf.constant([2 ** b - 1 for b in GAP_WIDTHS], exact)
    escapes = tf.cast(tf.reduce_sum(tf.floor(tf.cast(picked, exact)[:, None] / escape), 0), tf.float64)
    scale = tf.math.divide_no_nan(tf.cast(k, tf.float64), tf.cast(tf.size(picked), tf.float64))
    codes = k + tf.cast(tf.round(escapes * scale), tf.int64)
    positions = (codes * tf.constant(GAP_WIDTHS, tf.int64) + 7) // 8
    dense = tf.reshape(tf.cast(n, tf.int64) * value_bytes, [1])
    return HEADER_BYTES + tf.concat([dense, positions + k * value_bytes], 0)


def _places(count, b):
    """The 32-bit word (int32) and the bit within it (uint32) where each of ``count`` ``b``-bit
    codes starts."""
    bit = tf.range(tf.cast(count, tf.int64)) * tf.cast(b, tf.int64)
    return tf.cast(tf.bitwise.right_shift(bit, 5), tf.int32), tf.cast(tf.bitwise.bitwise_and(bit, 31), tf.uint32)


def _spread(codes, word, shift, width):
    """What each uint32 code of ``width`` bits puts into its word and into the next one, and
    those words' indices."""
    low = tf.bitwise.left_shift(codes, shift)
    high = tf.where(shift + tf.cast(width, tf.uint32) > 32, tf.bitwise.right_shift(codes, 32 - shift),
                    tf.zeros_like(codes))
    return tf.concat([low, high], 0), tf.concat([word, word + 1], 0)


def _pack(b, gaps):
    """The ``b``-bit codes of ``gaps`` (``b``: int32 scalar, 1 to 32), as bytes: each gap's
    escapes, then its remainder; each code, shifted to its bit, adds itself into the (at most
    two) little-endian 32-bit words it touches (codes share no bit, so the sum is their union);
    the last byte's spare high bits are ones. No branch: one graph serves every width."""
    escape = _escape(b)
    # floor(gap / escape) by a float64 division: exact (gaps < 2 ** 31), much cheaper than an integer one
    escapes = tf.cast(tf.floor(tf.cast(gaps, tf.float64) / tf.cast(escape, tf.float64)), tf.int32)
    count = tf.size(gaps) + tf.reduce_sum(escapes)
    at = tf.cumsum(escapes) + tf.range(tf.size(gaps))
    rest = tf.cast(gaps, tf.uint32) - tf.cast(escapes, tf.uint32) * escape
    codes = tf.tensor_scatter_nd_update(tf.fill([count], escape), at[:, None], rest)
    bits = tf.cast(count, tf.int64) * tf.cast(b, tf.int64)
    size = tf.cast((bits + 7) // 8, tf.int32)
    pad = tf.cast(size, tf.int64) * 8 - bits
    parts, words = _spread(codes, *_places(count, b), b)
    ones, at_end = _spread(_escape(tf.cast(pad, tf.int32))[None] * tf.cast(pad > 0, tf.uint32),
                           tf.cast(tf.bitwise.right_shift(bits, 5), tf.int32)[None],
                           tf.cast(tf.bitwise.bitwise_and(bits, 31), tf.uint32)[None], pad)
    packed = tf.math.unsorted_segment_sum(tf.concat([parts, ones], 0), tf.concat([words, at_end], 0),
                                          (size + 3) // 4 + 2)
    return tf.reshape(tf.bitcast(packed, tf.uint8), [-1])[:size]


def _unpack(b, packed):
    """Ascending int32 indices of ``b``-bit codes in ``packed`` bytes (``b``: int32 scalar): each
    code read from the two 32-bit words it can touch, whatever the width."""
    escape = _escape(b)
    size = tf.size(packed)
    count = tf.cast(tf.cast(size, tf.int64) * 8 // tf.cast(b, tf.int64), tf.int32)
    ones = tf.fill([tf.math.floormod(-size, 4) + 4], tf.constant(255, tf.uint8))
    words = tf.bitcast(tf.reshape(tf.concat([packed, ones], 0), [-1, 4]), tf.uint32)
    word, shift = _places(count, b)
    low = tf.bitwise.right_shift(tf.gather(words, word), shift)
    high = tf.where(shift + tf.cast(b, tf.uint32) > 32, tf.bitwise.left_shift(tf.gather(words, word + 1), 32 - shift),
                    tf.zeros_like(low))
    codes = tf.bitwise.bitwise_and(tf.bitwise.bitwise_or(low, high), escape)
    places = codes != escape
    cursor = tf.cumsum(tf.where(places, tf.cast(codes, tf.int64) + 1, tf.cast(escape, tf.int64)))
    return tf.cast(tf.boolean_mask(cursor - 1, places), tf.int32)


def encode(values, indices, n, header_digest=0, form=None, ascending=False):
    """The payload of ``values`` (already in their wire dtype) at distinct int32 ``indices`` of an
    ``n``-element tensor (``n`` and ``header_digest``: ints or int32 tensors), in the smallest format (or in ``form``, one of ``FORMATS``). Every
    format is computed by one graph (the positions of ``DENSE`` and the scatter of any other
    format are empty), so a payload costs no branch.

    Args:
        ascending: the caller's indices are ascending (else they are sorted here).

    Returns:
        ``(payload, format)``: flat uint8 payload, int32 format (``DENSE`` or a gap width).

    Raises:
        tf.errors.InvalidArgumentError: an index repeats (or, with ``ascending``, descends).
    """
    if form is not None and form not in FORMATS:
        raise ValueError(f"form must be one of {FORMATS}, got {form!r}")
    if not ascending:
        order = tf.argsort(indices, stable=True)
        values, indices = tf.gather(values, order), tf.gather(indices, order)
    distinct = tf.debugging.assert_non_negative(_gaps(indices), message="hvd_gradpart: a selected index repeats")
    if form is None:
        with tf.control_dependencies([distinct]):
            form = tf.gather(tf.constant(FORMATS, tf.int32), tf.argmin(sizes(indices, n, values.dtype.size)))
    else:
        form = tf.constant(form, tf.int32)
    dense = tf.equal(form, DENSE)
    k = tf.size(indices)
    positions = _pack(tf.maximum(form, 1), _gaps(indices))
    scattered = tf.math.unsorted_segment_sum(values, tf.where(dense, indices, -1), tf.where(dense, n, 0))
    body = [positions[:tf.where(dense, 0, tf.size(positions))], _as_bytes(scattered),
            _as_bytes(values[:tf.where(dense, 0, k)])]
    header = tf.concat([_as_bytes(tf.reshape(-1 - tf.cast(header_digest, tf.int32), [1])),
                        tf.cast(form, tf.uint8)[None], _as_bytes(k[None])], 0)
    return tf.concat([header, *body], 0), form


def header(payload):
    """``(int32 -1 - digest, int32 format, int32 k)`` of a payload."""
    tag = _from_bytes(payload[:4], tf.int32)[0]
    return tag, tf.cast(payload[4], tf.int32), _from_bytes(payload[5:HEADER_BYTES], tf.int32)[0]


def decode(payload, n, wire):
    """``(int32 indices, values of dtype wire)`` of one payload of an ``n``-element tensor:
    all ``n`` for ``DENSE``, else ``k``, ascending (one graph for every format)."""
    wire = tf.as_dtype(wire)
    _, form, k = header(payload)
    body = payload[HEADER_BYTES:]
    dense = tf.equal(form, DENSE)
    positions = tf.size(body) - tf.where(dense, n, k) * wire.size
    listed = _unpack(tf.maximum(form, 1), body[:positions])  # none for DENSE: its positions are empty
    return tf.concat([tf.range(tf.where(dense, n, 0)), listed], 0), _from_bytes(body[positions:], wire)
