"""Per-tensor, per-step accounting of what a compressor sent.

Each slot keeps scalar variables updated inside the training step: the last
step's selected elements and bytes sent by this rank (values, indices,
header and marker), running totals, and any diagnostics a selection rule
reports (thresholds, fitted parameters). ``snapshot`` reads them from Python;
``JsonlLogger`` and ``MetricsCallback`` write them out during training.

The figures a user watches come from the same counters. ``totals`` sums what
only grows (bytes dense and sent, elements offered and sent, and the link
budget's dense and sparse steps) into one ``Totals``; ``rates`` turns the
change between two of them into ratios, so a figure covers exactly the steps
between the two readings, and ``figures`` does both for a compressor.
``CompressionLogger`` reads at each epoch's start and end and puts the
epoch's figures into Keras's ``logs`` on rank 0, where the progress bar,
``History`` and ``TensorBoard`` find them.
"""
import json
import math
import statistics
import time
from typing import NamedTuple

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

COUNTERS = ("steps", "elements", "dense_bytes", "sent_elements", "sent_bytes",
            "total_dense_bytes", "total_sent_bytes", "total_sent_elements")


TOTALS = {"total_dense_bytes": "dense_bytes", "total_sent_bytes": "sent_bytes",
          "total_sent_elements": "sent_elements"}  # running total -> the step's figure it adds up


class Figures(NamedTuple):
    """One gradient's figures as a step records them: a float64 variable, a column per name."""

    variable: tf.Variable
    names: tuple


class TensorMetrics(tf.Module):
    """One gradient's traffic figures: one float64 variable with a named column per figure
    (``COUNTERS``, then what the method declares), read and written whole."""

    def __init__(self):
        super().__init__(name="metrics")
        self.names = ()
        self.variable = None

    def declare(self, names):
        """Adds columns for the ``names`` that have none yet, keeping the values recorded so far
        (declare every name before a step records: a step writes the variable it was handed)."""
        new = tuple(dict.fromkeys(n for n in names if n not in self.names))
        if not new:
            return
        with tf.init_scope():
            old = self.variable.numpy() if self.variable is not None else np.zeros([0])
            self.names += new
            self.variable = tf.Variable(np.concatenate([old, np.zeros([len(new)])]), trainable=False,
                                        dtype=tf.float64, name="figures")

    @property
    def figures(self):
        """``Figures`` of this gradient (every name declared so far)."""
        return Figures(self.variable, self.names)

    def record(self, elements, dense_bytes, sent_elements, sent_bytes, **diagnostics):
        """Adds one step's figures (tensors or numbers)."""
        self.declare(COUNTERS + tuple(diagnostics))
        record(self.figures, elements=elements, dense_bytes=dense_bytes, sent_elements=sent_elements,
               sent_bytes=sent_bytes, **diagnostics)

    def read(self):
        """The current values as Python floats, by name."""
        return {} if self.variable is None else dict(zip(self.names, self.variable.numpy().tolist()))


def _next(old, names, figures):
    """``old`` rows (``[..., len(names)]``) after one step's ``figures`` (name -> value, shaped as
    a row's leading dimensions): ``steps`` counts, totals add up, the others are set."""
    undeclared = set(figures) - set(names)
    if undeclared:
        raise KeyError(f"hvd_gradpart: metrics {sorted(undeclared)} were not declared (a selection rule lists "
                       "its diagnostics in DIAGNOSTICS)")
    shape = tf.shape(old)[:-1]
    column = lambda x: tf.broadcast_to(tf.cast(x, tf.float64), shape)
    zero = tf.zeros(shape, tf.float64)
    keep = tf.constant([0.0 if name in figures else 1.0 for name in names], tf.float64)
    added = [column(1.0) if name == "steps" else column(figures[TOTALS[name]]) if name in TOTALS
             else column(figures[name]) if name in figures else zero for name in names]
    return old * keep + tf.stack(added, axis=-1)


def record(figures, elements, dense_bytes, sent_elements, sent_bytes, **diagnostics):
    """Adds one step's figures into ``figures`` (``TensorMetrics.figures``: every name declared).

    Raises:
        KeyError: a figure has no declared column.
    """
    step = dict(elements=elements, dense_bytes=dense_bytes, sent_elements=sent_elements, sent_bytes=sent_bytes,
                **diagnostics)
    figures.variable.assign(_next(figures.variable.read_value(), figures.names, step), read_value=False)


def amend(figures, add=(), put=()):
    """Adds ``add`` (pairs of a name and a value) to, and sets ``put`` in, the columns of
    ``figures`` (what a step's second part sends, after the first part recorded)."""
    add, put = dict(add), dict(put)
    keep = tf.constant([0.0 if name in put else 1.0 for name in figures.names], tf.float64)
    zero = tf.constant(0.0, tf.float64)
    step = tf.stack([tf.cast(put.get(name, add.get(name, zero)), tf.float64) for name in figures.names])
    figures.variable.assign(figures.variable.read_value() * keep + step, read_value=False)


def record_each(each, **columns):
    """``record`` of several gradients at once: ``each`` their ``Figures`` (the same names),
    ``columns`` one value per gradient (``[T]`` tensors, or numbers every gradient shares);
    returns the writes."""
    names = each[0].names
    rows = _next(tf.stack([f.variable.read_value() for f in each]), names, columns)
    return [f.variable.assign(rows[i], read_value=False) for i, f in enumerate(each)]


def resolve(compression):
    """The instance doing the work: a sparse class given to Horovod runs on its default
    instance; None for Horovod's own dense compressors."""
    if isinstance(compression, type):
        return compression.instance() if hasattr(compression, "instance") else None
    return compression if hasattr(compression, "memory") else None


def snapshot(compressor):
    """``{slot key: {counter: value}}`` for every gradient ``compressor`` handled."""
    return {key: slot.metrics.read() for key, slot in compressor.memory.slots.items()}


def link_state(compressor):
    """The link budget's state of a compressor that follows the link: one step's, or ``{step:
    state}`` when several models trained; ``{}`` for any other."""
    link = {step: budget.read() for step, budget in getattr(compressor, "budgets", {}).items()}
    return next(iter(link.values())) if len(link) == 1 else link


def summary(compressor):
    """Totals over every gradient: bytes, last-step density and ratio (and, for a
    compressor that follows the link, its budget's state under ``link``: one step's, or
    ``{step: state}`` when several models trained)."""
    rows = snapshot(compressor).values()
    total = lambda name: sum(r.get(name, 0.0) for r in rows)
    elements, sent = total("elements"), total("sent_elements")
    sent_bytes = total("total_sent_bytes")
    link = link_state(compressor)
    return {
        **({"link": link} if link else {}),
        "tensors": len(rows),
        "last_density": sent / elements if elements else 0.0,
        "last_sent_bytes": total("sent_bytes"),
        "last_dense_bytes": total("dense_bytes"),
        "total_sent_bytes": sent_bytes,
        "total_sent_elements": total("total_sent_elements"),
        "total_dense_bytes": total("total_dense_bytes"),
        "compression_ratio": total("total_dense_bytes") / sent_bytes if sent_bytes else float("nan"),
    }


class JsonlLogger:
    """Appends one JSON object per call to a file."""

    def __init__(self, path):
        self.path = path

    def write(self, **record):
        record.setdefault("time", time.time())
        with open(self.path, "a") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


class MetricsCallback(tf.keras.callbacks.Callback):
    """Keras callback logging a compressor's metrics to JSONL.

    Args:
        compressor: the compressor instance (or class) given to Horovod.
        path: JSONL file to append to.
        every: log every this many batches (0: only at epoch end).
        per_tensor: include each gradient's counters, not just the summary.
    """

    def __init__(self, compressor, path, every=0, per_tensor=False):
        super().__init__()
        self.compressor = resolve(compressor)
        self.logger = JsonlLogger(path)
        self.every = every
        self.per_tensor = per_tensor
        self._batch = 0

    def _log(self, event, **extra):
        record = {"event": event, **summary(self.compressor), **extra}
        if self.per_tensor:
            record["tensors"] = snapshot(self.compressor)
        self.logger.write(**record)

    def on_train_batch_end(self, batch, logs=None):
        self._batch += 1
        if self.every and self._batch % self.every == 0:
            self._log("batch", batch=self._batch)

    def on_epoch_end(self, epoch, logs=None):
        self._log("epoch", epoch=epoch, **{k: float(v) for k, v in (logs or {}).items()})


class Totals(NamedTuple):
    """One rank's cumulative counters since training began (``totals``)."""

    dense_bytes: float = 0.0     # what the gradients would have taken dense
    sent_bytes: float = 0.0      # what was sent: values, indices, headers, markers
    elements: float = 0.0        # gradient elements offered (each gradient's size times its steps)
    sent_elements: float = 0.0   # values sent
    dense_steps: float = 0.0     # steps the link budget handed Horovod the whole gradient
    sparse_steps: float = 0.0    # steps it sent a selection (its first step is not counted)
    link_mbit: float = math.nan  # the link's bandwidth the budget measured last, Mbit/s (NaN: none yet)
    follows_link: bool = False   # the compressor has a link budget


def totals(compression):
    """The cumulative counters of ``compression`` (what was given to Horovod: class or instance);
    None for Horovod's own dense compressors."""
    from hvd_gradpart.budget import controller  # the budget's modules import this one

    compressor = resolve(compression)
    if compressor is None:
        return None
    rows = snapshot(compressor).values()
    total = lambda name: sum(r.get(name, 0.0) for r in rows)
    budgets = list(getattr(compressor, "budgets", {}).values())
    states = [controller.State.of(b.state.numpy()) for b in budgets]
    links = [8.0 * b.read()["bandwidth_MBps"] for b in budgets]
    links = [x for x in links if 0.0 < x < math.inf]
    return Totals(dense_bytes=total("total_dense_bytes"), sent_bytes=total("total_sent_bytes"),
                  elements=sum(r.get("steps", 0.0) * r.get("elements", 0.0) for r in rows),
                  sent_elements=total("total_sent_elements"),
                  dense_steps=sum(s.dense_steps for s in states), sparse_steps=sum(s.sparse_steps for s in states),
                  link_mbit=statistics.fmean(links) if links else math.nan, follows_link=bool(budgets))


def rates(now, before=None):
    """The figures of the steps between two ``Totals`` (``before`` None: since training began).

    Returns:
        ``{"gp_ratio": dense bytes / bytes sent, "gp_density": values sent / elements offered}``
        and, for a compressor that follows the link, ``"gp_dense_share"`` (the share of the
        budget's steps that went dense) and ``"gp_link_mbit"`` (its latest measure, not a
        difference). A figure with no steps behind it is NaN.
    """
    before = before or Totals()
    change = lambda name: getattr(now, name) - getattr(before, name)
    share = lambda part, whole: part / whole if whole > 0 else math.nan
    out = {"gp_ratio": share(change("dense_bytes"), change("sent_bytes")),
           "gp_density": share(change("sent_elements"), change("elements"))}
    if now.follows_link:
        dense = change("dense_steps")
        out["gp_dense_share"] = share(dense, dense + change("sparse_steps"))
        out["gp_link_mbit"] = now.link_mbit
    return out


def figures(compression, since=None):
    """``rates`` of ``compression``'s counters since the ``Totals`` ``since`` (None: since
    training began); ``{}`` for Horovod's own dense compressors.

    ``figures(compression)`` printed or written with ``tf.summary.scalar`` in a training loop
    gives the same keys ``CompressionLogger`` puts into Keras's logs.
    """
    now = totals(compression)
    return {} if now is None else rates(now, since)


class CompressionLogger(tf.keras.callbacks.Callback):
    """Puts each epoch's compression figures into Keras's ``logs`` on rank 0.

    Every figure covers the epoch just ended (the difference of cumulative counters read at
    its start and its end), not the run so far: ``gp_ratio``, ``gp_density`` and, for a
    compressor that follows the link, ``gp_dense_share`` and ``gp_link_mbit`` (``rates``).
    They count rank 0's own traffic; other ranks add nothing, as Horovod's examples log on
    rank 0 only.

    Order in ``callbacks``: after ``hvd.callbacks.MetricAverageCallback`` (it averages every
    key in ``logs`` over the ranks, and rank 1 has none of these), before ``TensorBoard`` and
    any other callback that writes ``logs``. Keras appends its progress bar and ``History``
    after the list, so they see the figures.

    Args:
        compression: what was given to ``hvd.DistributedOptimizer`` (class or instance).
        rank: this process's rank (None: ``hvd.rank()`` when training begins).
    """

    def __init__(self, compression, rank=None):
        super().__init__()
        self.compression = compression
        self.rank = rank
        self._before = None

    def on_train_begin(self, logs=None):
        if self.rank is None:
            self.rank = hvd.rank()

    def on_epoch_begin(self, epoch, logs=None):
        if self.rank == 0:
            self._before = totals(self.compression)

    def on_epoch_end(self, epoch, logs=None):
        if self.rank == 0 and logs is not None:
            logs.update(figures(self.compression, self._before))
