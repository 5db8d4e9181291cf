"""The candidate mask of a sparse step: one compiled pass, compacted by words.

A selection rule is elementwise (``|acc| > tau``, or a rule per partition area): one XLA kernel
evaluates it over the accumulated values and writes one byte per element. The same pass marks
every element that is NaN or Inf, so the finite test of the whole tensor costs no pass of its
own: the candidates contain every non-finite element, and checking the ``k`` candidate values
(``finite``) checks the tensor.

``tf.where`` over ``n`` booleans scans them one by one and costs more than the elementwise pass
itself. Here the byte mask is viewed, without a copy, as ``n / 8`` int64 words: ``tf.where``
over the words finds the nonzero ones, and a second ``tf.where`` over their bytes the positions,
so the work is ``O(n / 8 + 8 m)`` for ``m`` nonzero words, and indices come out ascending.

Updates after the selection touch ``k`` elements in place (``subtract_at``, ``zero_at``).

XLA compiles a pass once per distinct tensor size, and a conv net has dozens of sizes, most of
them small, where the plain kernels cost microseconds: ``by_size`` compiles passes over
``XLA_MIN_ELEMENTS`` elements or more only (``python -m benchmarks.startup --passes``).
"""
from typing import NamedTuple

import tensorflow as tf

WORD = 8
XLA_MIN_ELEMENTS = 1 << 16


class Candidates(NamedTuple):
    """The elements a rule's mask sets.

    Attributes:
        indices: their int32 indices, ascending.
        count: int32 scalar, how many.
    """

    indices: tf.Tensor
    count: tf.Tensor


class Swept(NamedTuple):
    """One step's accumulated values and what was derived from them; nothing is stored yet.

    Attributes:
        acc: accumulated flat values, what may be sent.
        state: the per-method variables' next values, ``{name: tensor}``.
        candidates: ``Candidates`` of the method's mask (none when it has no mask).
        plan: what the compressor prepared for the step.
        energy: float32 scalar, the sum of ``acc``'s squares.
    """

    acc: tf.Tensor
    state: dict
    candidates: Candidates
    plan: object
    energy: tf.Tensor


def by_size(compiled, n):
    """``compiled`` (a ``tf.function(jit_compile=True)`` whose first argument is the flat tensor
    passed over) for ``n`` elements from ``XLA_MIN_ELEMENTS`` up, else its Python function as
    plain kernels (nothing compiles); with ``n`` None (known as the graph runs) a function that
    chooses so at run time."""
    if n is not None:
        return compiled if n >= XLA_MIN_ELEMENTS else compiled.python_function

    def either(x, *args):
        return tf.cond(tf.size(x) >= XLA_MIN_ELEMENTS, lambda: compiled(x, *args),
                       lambda: compiled.python_function(x, *args))

    return either


def mask_bytes(acc, mask=None):
    """uint8 ``mask | ~isfinite(acc)``, padded to whole words (inside a compiled function)."""
    marked = tf.logical_not(tf.math.is_finite(acc))
    if mask is not None:
        marked = marked | mask
    return word_bytes(marked)


def word_bytes(mask):
    """A bool mask as uint8, padded to whole words, as ``compact`` takes it."""
    return tf.pad(tf.cast(mask, tf.uint8), [[0, tf.math.floormod(-tf.size(mask), WORD)]])


def compact(marked):
    """``Candidates`` of a ``mask_bytes`` result."""
    rows = tf.reshape(marked, [-1, WORD])
    hit = tf.cast(tf.where(tf.not_equal(tf.bitcast(rows, tf.int64), 0))[:, 0], tf.int32)
    at = tf.cast(tf.where(tf.not_equal(tf.gather(rows, hit), 0)), tf.int32)
    indices = tf.gather(hit, at[:, 0]) * WORD + at[:, 1]
    return Candidates(indices, tf.size(indices))


def subtract_at(x, indices, values):
    """``x`` less ``values`` at int32 ``indices``, in ``x``'s own buffer when
    nothing else holds it (``ScatterNdNonAliasingAdd`` forwards its input;
    ``tensor_scatter_nd_sub`` always copies the whole tensor)."""
    return tf.raw_ops.ScatterNdNonAliasingAdd(input=x, indices=indices[:, None], updates=-values)


def zero_at(x, indices):
    """``x`` with zeros at int32 ``indices`` (``subtract_at`` of the values there)."""
    return subtract_at(x, indices, tf.gather(x, indices))


def finite(acc, candidates):
    """Whether ``acc`` is finite, given ``Candidates`` of a mask that marks non-finite elements."""
    return tf.reduce_all(tf.math.is_finite(tf.gather(acc, candidates.indices)))

