"""Where a rank's selected values sit, in the fewest bytes: one format chosen per payload.

A payload is one flat ``uint8`` tensor: a 9-byte header (int32 ``-1 - digest``, one byte naming
the format, int32 ``k``, the number of values), the positions in that format, then the ``k``
values in the wire dtype, in ascending position. Formats: ``rows``, one int32 index per value;
``dense``, every one of the ``n`` values and no positions (unselected ones are zero); ``bitmap``,
one bit per element, set where a value was selected (``ceil(n / 8)`` bytes); and ``gaps<b>``,
each value's gap from the element after the previous one in ``b`` bits (``b`` in ``GAP_WIDTHS``),
where a gap too long for ``b`` bits is preceded by escape codes ``2 ** b - 1``, each of which
advances ``2 ** b - 1`` elements without a value. Gap codes are packed little-endian, as many as
fill a whole number of bytes of one 64-bit word (``lcm(b, 8) / b`` of them), and the payload ends
on the last byte that holds code bits; a decoder fills the rest of the word with ones, which read
as escapes and place nothing. Every format's size follows from ``n``, ``k`` and the gaps, so
``encode`` computes all of them in the graph (one ``[k, len(GAP_WIDTHS)]`` division) and writes
only the smallest (the first of equal ones, so ranks given equal selections write equal bytes).
Decoding gives the same ascending indices and values whatever the format, so a sum decoded from
them does not depend on which format each rank chose.
"""
import math

import tensorflow as tf

HEADER_BYTES = 9
GAP_WIDTHS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16)  # lcm(b, 8) <= 64: a word of codes fits uint64
FORMATS = ("rows", "dense", "bitmap") + tuple(f"gaps{b}" for b in GAP_WIDTHS)
INDEX_BYTES = 4


def _as_bytes(x):
    """``[m]`` tensor -> flat ``[m * itemsize]`` uint8."""
    return tf.reshape(tf.bitcast(x, tf.uint8), [-1])


def _from_bytes(raw, dtype):
    """Flat uint8 -> ``[m]`` tensor of ``dtype``."""
    return tf.bitcast(tf.reshape(raw, [-1, tf.as_dtype(dtype).size]), dtype)


def _word(b):
    """``(codes per word, bytes per word)`` of ``b``-bit gap codes."""
    bits = b * 8 // math.gcd(b, 8)
    return bits // b, bits // 8


def _ascending(values, indices):
    """``(values, indices)`` in ascending index order (sorted only when they are not)."""
    def order():
        at = tf.argsort(indices, stable=True)
        return tf.gather(values, at), tf.gather(indices, at)

    return tf.cond(tf.reduce_all(indices[1:] > indices[:-1]), lambda: (values, indices), order)


def _gaps(indices):
    """int32 gap of each index from the element after the previous one (the first: from 0)."""
    return indices - tf.concat([tf.zeros([1], tf.int32), indices[:-1] + 1], 0)


def sizes(indices, n, value_bytes):
    """int64 ``[len(FORMATS)]``: each format's payload bytes, header included, for ascending
    ``indices`` of an ``n``-element tensor; all but ``rows`` are priced out (int64 max) when
    two indices are equal."""
    k = tf.cast(tf.size(indices), tf.int64)
    gaps = _gaps(indices)
    # Escapes per width, sum(floor(gap / (2 ** b - 1))): a float division is exact here (float32
    # below 2 ** 23 elements: gaps, quotients and their sums stay under 2 ** 24) and much
    # cheaper than an integer one.
    exact = tf.float32 if n <= 2 ** 23 else tf.float64
    escape = tf.constant([2 ** b - 1 for b in GAP_WIDTHS], exact)
    escapes = tf.cast(tf.reduce_sum(tf.floor(tf.cast(gaps, exact)[:, None] / escape), 0), tf.int64)
    codes = k + escapes
    gap_bytes = [(codes[i] * b + 7) // 8 for i, b in enumerate(GAP_WIDTHS)]
    positional = tf.stack([tf.constant((n + 7) // 8, tf.int64)] + gap_bytes) + k * value_bytes
    dense = tf.constant(n * value_bytes, tf.int64)
    positional = tf.concat([dense[None], positional], 0)
    positional = tf.where(tf.reduce_all(gaps >= 0), positional, tf.int64.max - HEADER_BYTES)
    return HEADER_BYTES + tf.concat([[k * (INDEX_BYTES + value_bytes)], positional], 0)


def _rows(values, indices, n):
    return tf.concat([_as_bytes(indices), _as_bytes(values)], 0)


def _dense(values, indices, n):
    return _as_bytes(tf.scatter_nd(indices[:, None], values, [n]))


def _bitmap(values, indices, n):
    padded = (n + 7) // 8 * 8
    bits = tf.scatter_nd(indices[:, None], tf.ones_like(indices), [padded])
    packed = tf.reduce_sum(tf.reshape(bits, [-1, 8]) * tf.constant([1 << j for j in range(8)]), 1)
    return tf.concat([tf.cast(packed, tf.uint8), _as_bytes(values)], 0)


_WHOLE = {8: tf.uint8, 16: tf.uint16}  # widths whose codes are whole bytes: no packing


def _gap_coder(b):
    """Encoder of the ``gaps<b>`` format."""
    per, word_bytes = _word(b)
    escape = 2 ** b - 1

    def encode(values, indices, n):
        gaps = _gaps(indices)
        escapes = gaps // escape
        k = tf.size(indices)
        codes = k + tf.reduce_sum(escapes)
        slots = codes if b in _WHOLE else (codes + per - 1) // per * per
        at = tf.cumsum(escapes) + tf.range(k)
        tokens = tf.tensor_scatter_nd_update(tf.fill([slots], escape), at[:, None], gaps - escapes * escape)
        if b in _WHOLE:
            return tf.concat([_as_bytes(tf.cast(tokens, _WHOLE[b])), _as_bytes(values)], 0)
        tokens = tf.reshape(tf.cast(tokens, tf.uint64), [-1, per])
        word = tokens[:, 0]
        for j in range(1, per):
            word = tf.bitwise.bitwise_or(word, tf.bitwise.left_shift(tokens[:, j], tf.constant(b * j, tf.uint64)))
        packed = tf.reshape(tf.bitcast(word, tf.uint8)[:, :word_bytes], [-1])[:(codes * b + 7) // 8]
        return tf.concat([packed, _as_bytes(values)], 0)

    return encode


_ENCODERS = (_rows, _dense, _bitmap) + tuple(_gap_coder(b) for b in GAP_WIDTHS)


def encode(values, indices, n, header_digest=0, form=None):
    """The payload of ``values`` (already in their wire dtype) at int32 ``indices`` of an
    ``n``-element tensor, in the smallest format (or in ``form``, a name in ``FORMATS``;
    indices that repeat always travel as ``rows``).

    Returns:
        ``(payload, format)``: flat uint8 payload, int32 position in ``FORMATS``.
    """
    if form is not None and form not in FORMATS:
        raise ValueError(f"form must be one of {FORMATS}, got {form!r}")
    values, indices = _ascending(values, indices)
    priced = sizes(indices, n, values.dtype.size)
    if form is not None:
        forced = (tf.range(len(FORMATS)) == FORMATS.index(form)) & (priced < tf.int64.max)
        priced = tf.where(forced, tf.zeros([], tf.int64), priced)
    code = tf.cast(tf.argmin(priced), tf.int32)
    body = tf.switch_case(code, [lambda f=f: f(values, indices, n) for f in _ENCODERS])
    header = tf.concat([_as_bytes(tf.constant([-1 - header_digest], tf.int32)),
                        tf.cast(code, tf.uint8)[None], _as_bytes(tf.size(indices)[None])], 0)
    return tf.concat([header, body], 0), code


def header(payload):
    """``(int32 -1 - digest, int32 format, int32 k)`` of a payload."""
    tag = _from_bytes(payload[:4], tf.int32)[0]
    return tag, tf.cast(payload[4], tf.int32), _from_bytes(payload[5:HEADER_BYTES], tf.int32)[0]


def _decode_rows(body, k, n, wire):
    return _from_bytes(body[:INDEX_BYTES * k], tf.int32)


def _decode_dense(body, k, n, wire):
    return tf.range(n)


def _decode_bitmap(body, k, n, wire):
    bits = tf.bitwise.bitwise_and(tf.bitwise.right_shift(body[:(n + 7) // 8, None], tf.constant(list(range(8)), tf.uint8)), 1)
    return tf.cast(tf.where(tf.reshape(bits, [-1]) > 0)[:, 0], tf.int32)


def _gap_decoder(b):
    """Decoder of the ``gaps<b>`` format: the ascending indices."""
    per, word_bytes = _word(b)
    escape = 2 ** b - 1

    def decode(body, k, n, wire):
        packed = body[:tf.size(body) - k * wire.size]
        if b in _WHOLE:
            return _places(_from_bytes(packed, _WHOLE[b]))
        fill = -tf.size(packed) % word_bytes
        packed = tf.concat([packed, tf.fill([fill], tf.constant(255, tf.uint8))], 0)
        words = tf.pad(tf.reshape(packed, [-1, word_bytes]), [[0, 0], [0, 8 - word_bytes]])
        word = tf.bitcast(words, tf.uint64)
        shifts = tf.constant([b * j for j in range(per)], tf.uint64)
        tokens = tf.bitwise.bitwise_and(tf.bitwise.right_shift(word[:, None], shifts), escape)
        return _places(tf.reshape(tokens, [-1]))

    def _places(tokens):
        tokens = tf.cast(tokens, tf.int32)
        places = tokens != escape
        cursor = tf.cumsum(tf.where(places, tokens + 1, escape))
        return tf.boolean_mask(cursor - 1, places)

    return decode


_DECODERS = (_decode_rows, _decode_dense, _decode_bitmap) + tuple(_gap_decoder(b) for b in GAP_WIDTHS)


def decode(payload, n, wire):
    """``(int32 indices, values of dtype wire)`` of one payload of an ``n``-element tensor:
    ``n`` values for ``dense``, else ``k``, ascending."""
    wire = tf.as_dtype(wire)
    _, code, k = header(payload)
    body = payload[HEADER_BYTES:]
    indices = tf.switch_case(code, [lambda f=f: f(body, k, n, wire) for f in _DECODERS])
    count = tf.where(code == FORMATS.index("dense"), n, k)
    values = _from_bytes(body[tf.size(body) - count * wire.size:], wire)
    return indices, values
