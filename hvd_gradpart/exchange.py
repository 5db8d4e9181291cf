"""Sparse exchange behind Horovod's stock ``Compressor`` API.

Every sparse method ends here. A rank's selection (values and int32 indices)
is packed into one ``uint8`` payload of shape ``[1 + k, 4 + value_bytes]``:
one row per element (index bytes, then value bytes) after a header row whose
index field is ``-1 - digest``, ``digest`` being a 31-bit hash of the
gradient's size and dtype and of the compressor's settings. The header means
no rank ever hands Horovod an empty tensor, even when it selected nothing;
its negative index makes ``unsorted_segment_sum`` drop it while decoding, and
every rank checks that all headers agree, so ranks that run different models
or compressor settings stop with an error instead of mixing gradients. One
``hvd.allgather`` moves every rank's payload; each rank decodes all of them in
rank order into the same dense sum, so ranks stay bit-identical.

Horovod's own allreduce then runs on a one-element *marker* of ones. It comes
back as ``N * prescale * postscale`` for ``Sum`` and ``prescale * postscale``
for ``Average``, so ``sum * marker / N`` is exactly the reduction the caller
asked for (``Average``, ``Sum``, pre/postscale, ``gradient_predivide_factor``).
The scale is applied to the gathered values before they are summed, so the
dense result is written once.
"""
import zlib
from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf

INDEX_BYTES = 4
MARKER_DTYPE = tf.float32
ENCODINGS = ("native", "fp16")


class Encoded(NamedTuple):
    """One rank's packed selection.

    Attributes:
        payload: ``uint8 [1 + k, row_width]`` tensor for ``hvd.allgather``.
        sent: the selected values as every receiver decodes them, in the
            gradient's dtype; what encoding rounded off stays in the residual.
    """

    payload: tf.Tensor
    sent: tf.Tensor


def wire_dtype(dtype, encoding="native"):
    """The dtype values travel in: the gradient's own, or float16."""
    if encoding not in ENCODINGS:
        raise ValueError(f"value_encoding must be one of {ENCODINGS}, got {encoding!r}")
    return tf.float16 if encoding == "fp16" else tf.as_dtype(dtype)


def row_width(dtype, encoding="native"):
    """Bytes per selected element on the wire: index plus value."""
    return INDEX_BYTES + wire_dtype(dtype, encoding).size


def payload_bytes(k, dtype, encoding="native"):
    """Bytes one rank sends for ``k`` elements: rows, header and marker."""
    return (k + 1) * row_width(dtype, encoding) + MARKER_DTYPE.size


def _as_bytes(x):
    """``[k]`` tensor -> ``[k, itemsize]`` uint8."""
    return tf.reshape(tf.bitcast(x, tf.uint8), [-1, x.dtype.size])


def _from_bytes(raw, dtype):
    """``[k, itemsize]`` uint8 -> ``[k]`` tensor of ``dtype``."""
    return tf.bitcast(raw, dtype)


def _clip_to(values, wire):
    """Clips to ``wire``'s finite range when it is narrower (the excess stays in the residual)."""
    if wire.size >= values.dtype.size:
        return values
    return tf.clip_by_value(values, tf.cast(wire.min, values.dtype), tf.cast(wire.max, values.dtype))


def digest(text):
    """A 31-bit hash of ``text`` (the header's agreement check)."""
    return zlib.crc32(text.encode()) % (2 ** 31 - 1)


def encode(values, indices, encoding="native", header_digest=0):
    """Packs ``values`` found at int32 ``indices`` into one payload."""
    wire = wire_dtype(values.dtype, encoding)
    on_wire = tf.cast(_clip_to(values, wire), wire)
    index_col = tf.concat([tf.constant([-1 - header_digest], tf.int32), indices], 0)
    value_col = tf.concat([tf.zeros([1], wire), on_wire], 0)
    payload = tf.concat([_as_bytes(index_col), _as_bytes(value_col)], 1)
    return Encoded(payload, tf.cast(on_wire, values.dtype))


def decode_sum(gathered, n, dtype, encoding="native", scale=None, mismatch="ranks disagree"):
    """Scatter-adds every rank's gathered rows, times ``scale``, into a dense ``[n]`` sum.

    Half-precision values are summed in float32, then cast back.

    Raises:
        tf.errors.InvalidArgumentError: the header rows differ (message
            ``mismatch``): ranks packed different gradients or settings.
    """
    wire = wire_dtype(dtype, encoding)
    indices = _from_bytes(gathered[:, :INDEX_BYTES], tf.int32)
    headers = tf.boolean_mask(indices, indices < 0)
    agree = tf.debugging.assert_equal(tf.reduce_min(headers), tf.reduce_max(headers), message=mismatch)
    dtype = tf.as_dtype(dtype)
    acc = tf.float32 if dtype.size < 4 else dtype
    values = tf.cast(_from_bytes(gathered[:, INDEX_BYTES:], wire), acc)
    if scale is not None:
        values = values * tf.cast(scale, acc)
    with tf.control_dependencies([agree]):
        total = tf.math.unsorted_segment_sum(values, indices, n)
    return tf.cast(total, dtype)


def allgather(encoded):
    """Every rank's payload, concatenated in rank order."""
    return hvd.allgather(encoded.payload)


def marker():
    """The one-element tensor handed to Horovod's own allreduce."""
    return tf.ones([1], MARKER_DTYPE)


def marker_scale(reduced_marker):
    """The factor that turns the sum of selections into the requested reduction."""
    return reduced_marker[0] / hvd.size()
