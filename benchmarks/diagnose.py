"""Per-step diagnostics of a simulated run: the recorder behind ``benchmarks.simulate --diagnose``.

    python -m benchmarks.simulate MODEL RUN... --out EVALS.jsonl --diagnose STEPS.jsonl
        [--diagnose-every 1] [--optimizer sgd|adam]
    python -m benchmarks.report --diagnose DIR      # the tables (benchmarks/report/diagnose.py)

``benchmarks.simulate`` hands every step to a ``Recorder``, which writes one JSON line per
step (floats to 4 significant digits): ``loss`` (mean over workers), ``density`` (elements
sent / elements over every worker's sparsified tensors this step), ``grad_norm`` (global norm
of the averaged gradient the optimizer was handed), ``update_norm`` (global norm of the
trainable weights after the step less before), and for worker 0's sparsified tensors, in slot
order: ``rg`` (per tensor ``||r|| / ||g||``, the residual after the step against the step's
fresh gradient), ``age`` (the residual's mean age over the tensor's coordinates) and ``sent``
(that worker's density); ``rg_all``, ``age_all`` and ``age_mass`` are the same over all of
them, ``age_mass`` weighting each coordinate's age by ``|r|`` (how old the pending mass is).

Which coordinates were sent is read off the residual: error feedback stores ``acc = r + g``
less what was sent, so an unsent coordinate's residual is exactly ``r + g`` (one float add,
the same in numpy and in the compiled sweep) and a sent one's is zero or, with fp16 values,
fp16's rounding error. A coordinate's age counts the steps since it was last sent or its
residual was last zero (a coordinate whose gradient is always zero holds nothing and stays
at age 0). A run's first line also names the tensors: ``[variable, slot key, elements]``.
"""
import json
import math

import numpy as np

from hvd_gradpart.compressors.base import BaseCompressor


def _g4(x):
    """``x`` to 4 significant digits; None when not finite."""
    return float(f"{x:.4g}") if x is not None and math.isfinite(x) else None


def _norm(arrays):
    return math.sqrt(sum(float(np.dot(a, a)) for a in arrays))


class Recorder:
    """Writes one diagnostic record per ``every`` steps of a simulated run to ``path``.

    Args:
        path: JSONL file to append to.
        model: the Keras model being trained.
        compressors: the workers' compressors, worker 0 first.
        meta: fields every record carries (model, run, optimizer, seed).
        per_epoch: steps per epoch (for each record's ``epoch``).
        every: record every this many steps (ages are tracked at every step).
    """

    def __init__(self, path, model, compressors, meta, per_epoch, every=1):
        self.path, self.model, self.meta, self.per_epoch, self.every = path, model, meta, per_epoch, every
        self.sparse = [c for c in compressors if isinstance(c, BaseCompressor)]
        self.worker0 = self.sparse[0] if self.sparse else None
        self.weights, self.residuals, self.ages = [], [], None

    def _slots(self):
        return list(self.worker0.memory.slots.values()) if self.worker0 else []

    def before(self):
        """Reads the weights and worker 0's residuals before a step."""
        self.weights = [v.numpy().ravel() for v in self.model.trainable_variables]
        self.residuals = [s.residual.numpy() for s in self._slots()]

    def after(self, step, loss, grads, grad_norm):
        """Writes the record of ``step`` (1-based), given its mean ``loss``, worker 0's fresh
        ``grads`` and the averaged gradient's global norm."""
        update = [v.numpy().ravel() - w for v, w in zip(self.model.trainable_variables, self.weights)]
        record = {**self.meta, "step": step, "epoch": _g4(step / self.per_epoch), "loss": _g4(loss),
                  "grad_norm": _g4(grad_norm), "update_norm": _g4(_norm(update))}
        if self.worker0 is not None:
            record.update(self._residuals(step, grads))
        if step % self.every == 0 or step == 1:
            with open(self.path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def _residuals(self, step, grads):
        """The density and worker 0's residual figures of this step (module doc)."""
        rows = [r for c in self.sparse for r in (s.metrics.read() for s in c.memory.slots.values())]
        out = {"density": _g4(sum(r["sent_elements"] for r in rows) / sum(r["elements"] for r in rows))}
        slots = self._slots()
        fresh = [g.numpy().ravel() for g in grads if self.worker0.sparsifies(g)]
        if [s.shape.num_elements() for s in slots] != [g.size for g in fresh]:
            raise RuntimeError("diagnose: worker 0's slots and sparsified gradients do not line up")
        before = self.residuals or [np.zeros_like(g) for g in fresh]
        if self.ages is None:
            self.ages = [np.zeros(g.size, np.int64) for g in fresh]
        after = [s.residual.numpy() for s in slots]
        rg, age, sent = [], [], []
        for r0, g, r, a in zip(before, fresh, after, self.ages):
            moved = r != r0 + g  # sent this step (module doc)
            a += 1
            a[moved | (r == 0)] = 0
            gn = _norm([g])
            rg.append(_g4(_norm([r]) / gn if gn else None))
            age.append(_g4(float(a.mean())))
            sent.append(_g4(float(moved.mean())))
        n = sum(g.size for g in fresh)
        mass = sum(float(np.abs(r).sum()) for r in after)
        gn = _norm(fresh)
        out.update(rg=rg, age=age, sent=sent, rg_all=_g4(_norm(after) / gn if gn else None),
                   age_all=_g4(sum(float(a.sum()) for a in self.ages) / n),
                   age_mass=_g4(sum(float((a * np.abs(r)).sum()) for a, r in zip(self.ages, after)) / mass
                                if mass else None))
        if step == 1:
            names = [v.name for v, g in zip(self.model.trainable_variables, grads) if self.worker0.sparsifies(g)]
            out["tensors"] = [[name, s.key, s.shape.num_elements()] for name, s in zip(names, slots)]
        return out
