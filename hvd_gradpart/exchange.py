"""Sparse exchange behind Horovod's stock ``Compressor`` API.

Every sparse method ends here. A rank's selection (values and int32 indices)
is packed into one ``uint8`` payload of shape ``[1 + k, 4 + value_bytes]``:
one row per element (index bytes, then value bytes) after a header row whose
index field is ``-1 - digest``, ``digest`` being a 31-bit hash of the
gradient's size and dtype and of the compressor's settings. The header means
no rank ever hands Horovod an empty tensor, even when it selected nothing;
its negative index makes ``unsorted_segment_sum`` drop it while decoding, and
every rank checks that all headers agree, so ranks that run different models
or compressor settings stop with an error instead of mixing gradients. Each
rank decodes every rank's rows in rank order into the same dense sum, so
ranks stay bit-identical.

Payloads travel in groups, one ``hvd.allgather`` per group. ``compress``
only queues its payload on the open ``Group`` of the graph it is traced in
(of eager code, outside any graph) and keeps a ``Ticket``; the first
``decompress`` that asks for its rows closes the group and gathers all of
it. Horovod's grouped path (``num_groups=``/``groups=``) compresses every
tensor of a group before it decompresses any, so all of them share one
collective; without groups each tensor sits in its own ``tf.cond`` branch
graph and its group holds it alone. A rank's block is one flat ``uint8``
tensor: an int32 tag ``-1 - digest`` of every payload's header, the row count
of each payload, then the payloads' bytes. A receiver walks the blocks in
rank order: it checks each tag before it reads that block's counts, so
ranks whose groups differ stop with an error before any offset is trusted.

Horovod's own allreduce then runs on a one-element *marker* of ones. It comes
back as ``N * prescale * postscale`` for ``Sum`` and ``prescale * postscale``
for ``Average``, so ``sum * marker / N`` is exactly the reduction the caller
asked for (``Average``, ``Sum``, pre/postscale, ``gradient_predivide_factor``).
Under elastic training ``N``, like the number of blocks a receiver walks, is
read as the graph runs (``world_size``), so one trace stays exact when ranks
leave or join.
The scale is applied to the gathered values before they are summed, so the
dense result is written once.
"""
import os
import threading
import weakref
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


def payload_bytes(k, dtype, encoding="native", opens_group=False):
    """Bytes one rank sends for ``k`` elements: rows, header, row count and
    marker, plus the group's tag for the payload that ``opens_group``."""
    tag = INDEX_BYTES if opens_group else 0
    return (k + 1) * row_width(dtype, encoding) + INDEX_BYTES + tag + MARKER_DTYPE.size


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


class Group:
    """Payloads queued in one graph (or eagerly) until their common allgather."""

    def __init__(self):
        self.payloads, self.digests, self.whats, self.skips = [], [], [], []
        self.parts = None

    def add(self, payload, header_digest, what, skip=None):
        """Queues ``payload``; returns its position in the group. ``skip``: a bool tensor,
        true on a step whose payload is empty because its gradient went dense."""
        if self.parts is not None:
            raise RuntimeError("hvd_gradpart: a payload was queued on a group already gathered")
        self.payloads.append(payload)
        self.digests.append(header_digest)
        self.whats.append(what)
        self.skips.append(skip)
        return len(self.payloads) - 1

    def rows(self, position):
        """Every rank's rows of payload ``position`` in rank order; gathers the group once,
        unless every payload in it skips (then each has no rows)."""
        if self.parts is None:
            widths = [int(p.shape[1]) for p in self.payloads]
            if any(skip is None for skip in self.skips):
                self.parts = self._gather(widths)
            else:
                nothing = [tf.zeros([0, w], tf.uint8) for w in widths]
                self.parts = tf.cond(tf.reduce_all(tf.stack(self.skips)), lambda: nothing,
                                     lambda: self._gather(widths))
        return self.parts[position]

    def _gather(self, widths):
        tag = group_tag(self.digests)
        everyone = hvd.allgather(pack(self.payloads, tag))
        return unpack(everyone, widths, tag, self._mismatch())

    def _mismatch(self):
        shown = ", ".join(self.whats[:3]) + (f" and {len(self.whats) - 3} more" if len(self.whats) > 3 else "")
        return (f"hvd_gradpart: ranks disagree on the {len(self.whats)} gradient(s) exchanged together "
                f"({shown}): every rank must build the same model and the same compressor settings, "
                "and group gradients the same way")


class Ticket(NamedTuple):
    """Where a queued payload's gathered rows will come from."""

    group: Group
    position: int

    def rows(self):
        """Every rank's rows of this payload (gathers the group on first use)."""
        return self.group.rows(self.position)


_OPEN = weakref.WeakKeyDictionary()
_EAGER = threading.local()


def _open_group():
    """The group payloads queued now would join, or None when a new one must open."""
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    group = getattr(_EAGER, "group", None) if graph is None else _OPEN.get(graph)
    return None if group is None or group.parts is not None else group


def queued():
    """How many payloads the open group of the current graph holds (0: the next one opens it)."""
    group = _open_group()
    return 0 if group is None else len(group.payloads)


def enqueue(payload, header_digest, what, skip=None):
    """Queues ``payload`` on the open group of the current graph; returns its ``Ticket``.

    Args:
        payload: ``encode``'s payload (or an empty one when ``skip`` holds).
        header_digest: the digest packed in its header row.
        what: the gradient, as named in a disagreement error.
        skip: see ``Group.add``.
    """
    group = _open_group()
    if group is None:
        group = Group()
        if tf.executing_eagerly():
            _EAGER.group = group
        else:
            _OPEN[tf.compat.v1.get_default_graph()] = group
    return Ticket(group, group.add(payload, header_digest, what, skip))


def group_tag(header_digests):
    """The digest of a group: of every payload's header, in order."""
    return digest(repr(list(header_digests)))


def pack(payloads, tag):
    """One rank's block: int32 ``-1 - tag`` and each payload's row count, then the payloads' bytes."""
    counts = tf.stack([tf.shape(p, out_type=tf.int32)[0] for p in payloads])
    head = tf.concat([tf.constant([-1 - tag], tf.int32), counts], 0)
    return tf.concat([tf.reshape(_as_bytes(head), [-1])] + [tf.reshape(p, [-1]) for p in payloads], 0)


def unpack(everyone, widths, tag, mismatch, size=None):
    """Splits the gathered blocks of every rank; returns each payload's rows from all ranks.

    With a known number of ranks (``size``, default ``world_size()``, a Python
    int) the walk over the blocks is unrolled; with a tensor (elastic
    training) it is a ``tf.while_loop``, so one trace serves any number of
    ranks (about 1 ms more per gathered group here).

    Raises:
        tf.errors.InvalidArgumentError: a rank's tag differs (message ``mismatch``),
            checked before that rank's counts are read.
    """
    size = world_size() if size is None else size
    m = len(widths)
    head_bytes = INDEX_BYTES * (m + 1)
    row_bytes = tf.constant(widths, tf.int32)
    if isinstance(size, int):
        start, sizes = tf.constant(0, tf.int32), []
        for _ in range(size):
            lengths = _counts(everyone, start, m, tag, mismatch) * row_bytes
            sizes.append(tf.concat([[head_bytes], lengths], 0))
            start = start + head_bytes + tf.reduce_sum(lengths)
        pieces = tf.split(everyone, tf.concat(sizes, 0), num=size * (m + 1))
        return [tf.concat([tf.reshape(pieces[r * (m + 1) + 1 + i], [-1, widths[i]]) for r in range(size)], 0)
                for i in range(m)]

    def block(r, start, starts, counts):
        count = _counts(everyone, start, m, tag, mismatch)
        return (r + 1, start + head_bytes + tf.reduce_sum(count * row_bytes),
                starts.write(r, start), counts.write(r, count))

    blocks = (tf.constant(0), tf.constant(0), tf.TensorArray(tf.int32, size=0, dynamic_size=True),
              tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[m]))
    _, _, starts, counts = tf.while_loop(lambda r, *_: r < size, block, blocks)
    lengths = tf.reshape(counts.stack(), [-1, m]) * row_bytes  # [ranks, m] bytes of each payload
    offsets = tf.reshape(starts.stack(), [-1, 1]) + head_bytes + tf.cumsum(lengths, axis=1, exclusive=True)
    return [tf.reshape(tf.gather(everyone, tf.ragged.range(offsets[:, i], offsets[:, i] + lengths[:, i]).flat_values),
                       [-1, widths[i]]) for i in range(m)]


def _counts(everyone, start, m, tag, mismatch):
    """The ``m`` row counts of the block at byte ``start``, read once its tag is checked."""
    found = _from_bytes(tf.reshape(tf.slice(everyone, [start], [INDEX_BYTES]), [1, INDEX_BYTES]), tf.int32)
    with tf.control_dependencies([tf.debugging.assert_equal(found, [-1 - tag], message=mismatch)]):
        return _from_bytes(tf.reshape(tf.slice(everyone, [start + INDEX_BYTES], [INDEX_BYTES * m]),
                                      [m, INDEX_BYTES]), tf.int32)


def world_size():
    """The number of ranks: an int32 tensor read as the graph runs (Horovod's ``size_op``)
    under elastic training (``HOROVOD_ELASTIC=1``), where ranks come and go under one
    trace, as Horovod's own reductions read it; else the Python int ``hvd.size()``."""
    if int(os.environ.get("HOROVOD_ELASTIC", 0)):
        return hvd.size_op()
    return hvd.size()


def marker():
    """The one-element tensor handed to Horovod's own allreduce."""
    return tf.ones([1], MARKER_DTYPE)


def marker_scale(reduced_marker):
    """The factor that turns the sum of selections into the requested reduction."""
    return reduced_marker[0] / tf.cast(world_size(), reduced_marker.dtype)
