"""Sparse exchange behind Horovod's stock ``Compressor`` API.

Every sparse method ends here. A rank's selection (values and int32 indices)
is packed into one flat ``uint8`` payload (``hvd_gradpart.formats``): a
header (int32 ``-1 - digest``, the format, the value count), the positions
in whichever format is smallest for this selection (delta codes of 32, 16
or fewer bits with an escape for long gaps, 1 bit being a position bitmap,
or none when every value is sent), then the values.
``digest`` is a 31-bit hash of the gradient's size and dtype and of the
compressor's settings. The header means no rank ever hands Horovod an empty
tensor, even when it selected nothing, and every rank checks that all
headers agree before it decodes any payload, so ranks that run different
models or compressor settings stop with an error instead of mixing gradients.
Each rank decodes every rank's payload in rank order and sums them in one
scatter into the same dense result, so ranks stay bit-identical.

Payloads travel in groups, one ``hvd.allgather`` per group. ``compress``
only queues its payload on the open ``Group`` of the graph it is traced in
(of eager code, outside any graph) and keeps a ``Ticket``; the first
``decompress`` that asks for its payloads closes the group and gathers all of
it. Horovod's grouped path (``num_groups=``/``groups=``) compresses every
tensor of a group before it decompresses any, so all of them share one
collective; without groups each tensor sits in its own ``tf.cond`` branch
graph and its group holds it alone. A rank's block is one flat ``uint8``
tensor: an int32 tag ``-1 - digest`` of every payload's header, the byte
length of each payload, then the payloads. A receiver walks the blocks in
rank order: it checks each tag before it reads that block's lengths, so
ranks whose groups differ stop with an error before any offset is trusted.

Horovod's own allreduce then runs on a one-element *marker* of ones. It comes
back as ``N * prescale * postscale`` for ``Sum`` and ``prescale * postscale``
for ``Average``, so ``sum * marker / N`` is exactly the reduction the caller
asked for (``Average``, ``Sum``, pre/postscale, ``gradient_predivide_factor``).
The scale is applied to the gathered values before they are summed, so the
dense result is written once.

Under elastic training (``HOROVOD_ELASTIC=1``) ranks leave and join under one
traced step, so ``N``, the number of blocks a receiver walks and the number of
payloads it decodes are read as the graph runs (``world_size``): the walk and
the per-rank decode are then ``tf.while_loop``s (``unpack`` hands each
payload's copies as ``Copies``, ``each_rank`` decodes them) that sum the same
values in the same rank order, so the result is bit-identical to the walk
and decode unrolled over the known ranks of a fixed launch (about 1 ms
cheaper per group, hence kept there).
"""
import os
import threading
import weakref
import zlib
from typing import NamedTuple

import horovod.tensorflow as hvd
import tensorflow as tf

from hvd_gradpart import branch, formats

COUNT_BYTES = 4  # int32 tag of a group, int32 byte length of each payload
MARKER_DTYPE = tf.float32
ENCODINGS = ("native", "fp16")


class Encoded(NamedTuple):
    """One rank's packed selection.

    Attributes:
        payload: flat ``uint8`` tensor for ``hvd.allgather`` (``hvd_gradpart.formats``).
        sent: the selected values as every receiver decodes them, in the
            gradient's dtype and the order given; what encoding rounded off
            stays in the residual.
        format: int32 scalar, the payload's position format (``formats.DENSE`` or a gap width).
    """

    payload: tf.Tensor
    sent: tf.Tensor
    format: tf.Tensor


def wire_dtype(dtype, encoding="native"):
    """The dtype values travel in: the gradient's own, or float16."""
    if encoding not in ENCODINGS:
        raise ValueError(f"value_encoding must be one of {ENCODINGS}, got {encoding!r}")
    return tf.float16 if encoding == "fp16" else tf.as_dtype(dtype)


def sent_bytes(payload, opens_group=False):
    """Bytes one rank sends for ``payload``: the payload, its length in the group's block and
    its marker, plus the group's tag for the payload that ``opens_group`` (a bool or bool
    tensor); an int32 tensor."""
    return tf.size(payload) + COUNT_BYTES * (1 + tf.cast(opens_group, tf.int32)) + MARKER_DTYPE.size


def to_wire(values, wire):
    """``values`` in the ``wire`` dtype, clipped to its finite range when it is narrower (the
    excess stays in the residual)."""
    if wire.size < values.dtype.size:
        values = tf.clip_by_value(values, tf.cast(wire.min, values.dtype), tf.cast(wire.max, values.dtype))
    return tf.cast(values, wire)


def digest(text):
    """A 31-bit hash of ``text`` (the header's agreement check)."""
    return zlib.crc32(text.encode()) % (2 ** 31 - 1)


def encode(values, indices, n, encoding="native", header_digest=0, ascending=False, form=None):
    """Packs ``values`` found at distinct int32 ``indices`` of an ``n``-element gradient into
    one payload, in the smallest format (or in ``form``, one of ``formats.FORMATS``: no pricing);
    ``ascending``: the indices are (else they are sorted, and ``sent`` is in the order given)."""
    wire = wire_dtype(values.dtype, encoding)
    on_wire = to_wire(values, wire)
    payload, form = formats.encode(on_wire, indices, n, header_digest, form=form, ascending=ascending)
    return Encoded(payload, tf.cast(on_wire, values.dtype), form)


class Copies(NamedTuple):
    """Every rank's copy of one payload when the number of ranks is a tensor (elastic
    training): rank ``r``'s is ``everyone[starts[r]:starts[r] + lengths[r]]``."""

    everyone: tf.Tensor  # the gathered blocks, flat uint8
    starts: tf.Tensor  # int32 [ranks]
    lengths: tf.Tensor  # int32 [ranks]


def each_rank(copies, fn, dtypes):
    """``fn`` of every rank's copy (a payload -> tensors of ``dtypes``), each of its outputs
    concatenated over the ranks in rank order: unrolled over a list, a ``tf.while_loop``
    over ``Copies``."""
    if not isinstance(copies, Copies):
        return [tf.concat(parts, 0) for parts in zip(*[fn(p) for p in copies])]
    ranks = tf.size(copies.starts)

    def step(r, outs):
        copy = tf.slice(copies.everyone, copies.starts[r:r + 1], copies.lengths[r:r + 1])
        return r + 1, [out.write(r, x) for out, x in zip(outs, fn(copy))]

    outs = [tf.TensorArray(dtype, size=ranks, infer_shape=False) for dtype in dtypes]
    _, outs = tf.while_loop(lambda r, _: r < ranks, step, (tf.constant(0), outs))
    return [out.concat() for out in outs]


def decode_sum(payloads, n, dtype, encoding="native", scale=None, mismatch="ranks disagree"):
    """Scatter-adds every rank's payload (a list in rank order, or ``Copies``), times
    ``scale``, into a dense ``[n]`` sum.

    Half-precision values are summed in float32, then cast back.

    Raises:
        tf.errors.InvalidArgumentError: the headers differ (message ``mismatch``, a string or
            a string tensor): ranks packed different gradients or settings; checked before any
            payload is decoded.
    """
    wire = wire_dtype(dtype, encoding)
    (tags,) = each_rank(payloads, lambda p: [formats.header(p)[0][None]], [tf.int32])
    agree = tf.debugging.Assert(tf.equal(tf.reduce_min(tags), tf.reduce_max(tags)), [mismatch])
    dtype = tf.as_dtype(dtype)
    acc = tf.float32 if dtype.size < 4 else dtype
    with tf.control_dependencies([agree]):
        indices, values = each_rank(payloads, lambda p: formats.decode(p, n, wire), [tf.int32, wire])
    values = tf.cast(values, acc)
    if scale is not None:
        values = values * tf.cast(scale, acc)
    total = tf.scatter_nd(indices[:, None], values, [n])  # sums repeated indices, in order; cheaper than a segment sum
    return tf.cast(total, dtype)


def _no_copies(size):
    """Every rank's copy of an empty payload (``size`` ranks, an int or a tensor)."""
    empty = tf.zeros([0], tf.uint8)
    if isinstance(size, int):
        return [empty] * size
    return Copies(empty, tf.zeros([size], tf.int32), tf.zeros([size], tf.int32))


class Deferred:
    """A payload made only when its group is gathered (several gradients' one payload, which
    grows while they queue): what ``Group.add`` takes in place of a tensor."""

    def payload(self):
        """The payload tensor, made once, in the graph that gathers the group."""
        raise NotImplementedError

    def header(self):
        """The digest its header carries, once every gradient joined."""
        raise NotImplementedError

    def what(self):
        """What it carries, as named in a disagreement error."""
        raise NotImplementedError


class Group:
    """Payloads queued in one graph (or eagerly) until their common allgather."""

    def __init__(self):
        self.payloads, self.digests, self.whats, self.skips = [], [], [], []
        self.parts = None

    def add(self, payload, header_digest, what, skip=None):
        """Queues ``payload`` (a tensor, or a ``Deferred`` with None for the digest and what);
        returns its position in the group. ``skip``: a bool tensor, true on a step whose
        payload is empty because its gradients went dense."""
        if self.parts is not None:
            raise RuntimeError("hvd_gradpart: a payload was queued on a group already gathered")
        self.payloads.append(payload)
        self.digests.append(header_digest)
        self.whats.append(what)
        self.skips.append(skip)
        return len(self.payloads) - 1

    def gathered(self, position):
        """Every rank's payload ``position``, in rank order (see ``unpack``); gathers the group
        once (``Deferred`` payloads made first), unless every payload in it skips (then each is
        empty)."""
        if self.parts is None:
            for i, deferred in enumerate(self.payloads):
                if isinstance(deferred, Deferred):
                    self.payloads[i], self.digests[i], self.whats[i] = (
                        deferred.payload(), deferred.header(), deferred.what())
            if any(skip is None for skip in self.skips):
                self.parts = self._gather()
            else:
                nothing = [_no_copies(world_size()) for _ in self.payloads]
                self.parts = branch.cond(tf.reduce_all(tf.stack(self.skips)), lambda: nothing, self._gather)
        return self.parts[position]

    def _gather(self):
        tag = group_tag(self.digests)
        everyone = hvd.allgather(pack(self.payloads, tag))
        return unpack(everyone, len(self.payloads), tag, self._mismatch())

    def _mismatch(self):
        shown = ", ".join(self.whats[:3]) + (f" and {len(self.whats) - 3} more" if len(self.whats) > 3 else "")
        return (f"hvd_gradpart: ranks disagree on the {len(self.whats)} gradient(s) exchanged together "
                f"({shown}): every rank must build the same model and the same compressor settings, "
                "and group gradients the same way")


class Ticket(NamedTuple):
    """Where a queued payload's gathered copies will come from."""

    group: Group
    position: int

    def payloads(self):
        """Every rank's copy of this payload, in rank order (gathers the group on first use)."""
        return self.group.gathered(self.position)


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


def open_group():
    """The open group of the current graph, opened when there is none."""
    group = _open_group()
    if group is None:
        group = Group()
        if tf.executing_eagerly():
            _EAGER.group = group
        else:
            _OPEN[tf.compat.v1.get_default_graph()] = group
    return group


def enqueue(payload, header_digest, what, skip=None):
    """Queues ``payload`` on the open group of the current graph; returns its ``Ticket``.

    Args:
        payload: ``encode``'s payload (or an empty one when ``skip`` holds), or a ``Deferred``.
        header_digest: the digest packed in its header (None for a ``Deferred``).
        what: the gradient, as named in a disagreement error (None for a ``Deferred``).
        skip: see ``Group.add``.
    """
    group = open_group()
    return Ticket(group, group.add(payload, header_digest, what, skip))


def group_tag(header_digests):
    """The digest of a group: of every payload's header, in order."""
    return digest(repr(list(header_digests)))


def pack(payloads, tag):
    """One rank's block: int32 ``-1 - tag`` and each payload's byte length, then the payloads."""
    head = tf.stack([tf.constant(-1 - tag, tf.int32)] + [tf.size(p, out_type=tf.int32) for p in payloads])
    return tf.concat([tf.reshape(tf.bitcast(head, tf.uint8), [-1])] + list(payloads), 0)


def unpack(everyone, m, tag, mismatch, size=None):
    """Walks the gathered blocks of every rank (``m`` payloads each); returns each payload's
    copies from all ranks, in rank order.

    With a known number of ranks (``size``, default ``world_size()``: a Python int) the
    walk is unrolled and each payload's copies are a list; with a tensor (elastic training)
    it is a ``tf.while_loop`` and they are ``Copies``, so one trace serves any number of
    ranks (about 1 ms more per gathered group here).

    Raises:
        tf.errors.InvalidArgumentError: a rank's tag differs (message ``mismatch``),
            checked before that rank's lengths are read.
    """
    size = world_size() if size is None else size
    head_bytes = COUNT_BYTES * (m + 1)
    if isinstance(size, int):
        start, sizes = tf.constant(0, tf.int32), []
        for _ in range(size):
            lengths = _lengths(everyone, start, m, tag, mismatch)
            sizes.append(tf.concat([[head_bytes], lengths], 0))
            start = start + head_bytes + tf.reduce_sum(lengths)
        pieces = tf.split(everyone, tf.concat(sizes, 0), num=size * (m + 1))
        return [[pieces[r * (m + 1) + 1 + i] for r in range(size)] for i in range(m)]

    def block(r, start, starts, lengths):
        found = _lengths(everyone, start, m, tag, mismatch)
        return r + 1, start + head_bytes + tf.reduce_sum(found), starts.write(r, start), lengths.write(r, found)

    blocks = (tf.constant(0), tf.constant(0), tf.TensorArray(tf.int32, size=size),
              tf.TensorArray(tf.int32, size=size, element_shape=[m]))
    _, _, starts, lengths = tf.while_loop(lambda r, *_: r < size, block, blocks)
    lengths = tf.reshape(lengths.stack(), [-1, m])  # [ranks, m]: bytes of each payload
    starts = tf.reshape(starts.stack(), [-1, 1]) + head_bytes + tf.cumsum(lengths, axis=1, exclusive=True)
    return [Copies(everyone, starts[:, i], lengths[:, i]) for i in range(m)]


def _lengths(everyone, start, m, tag, mismatch):
    """The ``m`` payload lengths of the block at byte ``start``, read once its tag is checked."""
    word = lambda at, count: tf.bitcast(tf.reshape(tf.slice(everyone, [at], [COUNT_BYTES * count]),
                                                   [count, COUNT_BYTES]), tf.int32)
    with tf.control_dependencies([tf.debugging.assert_equal(word(start, 1), [-1 - tag], message=mismatch)]):
        return word(start + COUNT_BYTES, m)


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
