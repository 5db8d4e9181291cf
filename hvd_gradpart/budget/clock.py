"""Step clock: a step's wall time, its exposed link time and the rest, per mode, smoothed.

Each rank stamps, per gradient, when its ``compress`` began, when it ended and when the
matching ``decompress`` began. A step runs from the first ``compress`` of one step to the
first of the next; its exposed link time runs from the last ``compress``'s end to the last
``decompress``'s start (what the step waits for once every payload is handed over; with
Horovod's per-tensor path the earlier collectives overlap later compress passes, which is
not the link's cost). The rest is the step's own work. Ranks average these through the
marker; the link time is then the least over ranks (mean less spread): a rank that
reached the collective first also waited for the others' compute.
"""
import math
from typing import NamedTuple


class Stamp(NamedTuple):
    """One stamps row: a gradient's (or a group's, sent together) times and counts of one step, as
    a ``Budget``'s stamps variables hold them, in this order."""

    began: float       # when its compress work began (timestamp, s)
    left: float        # when it ended: its payload, or its dense values, handed over
    arrived: float     # when its sum was in hand
    sent_bytes: float  # bytes this rank sent
    values: float      # values sent
    offered: float     # values the rule offered before its guards
    elements: float    # the gradients' elements
    energy: float      # the accumulated values' energy (not finite: a step the optimizer skipped)
    least: float       # the least sent value, squared
    dense: float       # 1 on a dense step


class Counts(NamedTuple):
    """What a step counts of itself (``Stamp``'s counts, as its function returns them)."""

    sent_bytes: float
    values: float
    offered: float
    energy: float
    least: float


def step_figures(raw, last_began):
    """This rank's figures of the last step from every stamps row.

    Args:
        raw: the rows of the last step (``Stamp`` fields, in order).
        last_began: the step before's first ``began`` (0: none yet).

    Returns:
        ``(began, figures)``: this step's first ``began``, and ``{step_s, link_s, compress_s,
        dense, sent_bytes, values, capped, elements, trained}`` (``step_s``
        0 when unknown; ``trained`` 0 when a row's accumulated energy was not finite: the
        step sent NaN in its place and every rank's optimizer skipped it; ``compress_s`` the
        compress passes' time, summed over rows; ``capped`` the values offered over those
        sent, a geometric mean over the rows that sent, by size: the ceiling holds for the
        bulk of the gradient when it is well above 1, the floor when well below).
    """
    rows = [Stamp(*r) for r in raw]
    began = min(r.began for r in rows)
    link_s = max(0.0, max(r.arrived for r in rows) - max(r.left for r in rows))
    sending = [r for r in rows if r.values > 0.0 and r.dense < 0.5]
    weight = sum(r.elements for r in sending)
    capped = math.exp(sum(r.elements * math.log(max(r.offered, 1.0) / r.values) for r in sending) / weight
                      ) if weight else 1.0
    return began, {"step_s": began - last_began if last_began > 0.0 else 0.0, "link_s": link_s,
                   "compress_s": sum(max(r.left - r.began, 0.0) for r in rows),
                   "dense": 1.0 if any(r.dense > 0.5 for r in rows) else 0.0,
                   "sent_bytes": sum(r.sent_bytes for r in rows), "values": sum(r.values for r in rows),
                   "capped": capped, "elements": sum(r.elements for r in rows),
                   "trained": float(all(math.isfinite(r.energy) for r in rows))}


def smoothed(old, new, config):
    """``old`` moved toward ``new`` (``new`` itself while ``old`` is 0); a long pause counts
    as at most ``config.pause_factor`` times ``old``."""
    if old <= 0.0:
        return new
    return config.smoothing * old + (1 - config.smoothing) * min(new, config.pause_factor * old)


CARRIED = ("valid", "step_id", "step_s", "link_s", "link_sq", "compress_s", "dense", "sent_bytes", "values",
           "capped", "elements")


def carried(step_id, figures):
    """What the first marker carries of this rank's ``step_figures`` (``CARRIED``, in order):
    valid when the step's time is known and it trained."""
    valid = figures["step_s"] > 0.0 and figures["trained"] > 0.5
    return ([float(valid), float(step_id), figures["step_s"], figures["link_s"], figures["link_s"] ** 2]
            + [figures[name] for name in CARRIED[5:]])


def shared_figures(means):
    """The figures every rank folds, from the means over ranks of what they carried: the link
    time is the least over ranks (the mean less the spread; exact for two)."""
    f = dict(zip(CARRIED, means))
    f["link_s"] = max(f["link_s"] - max(f["link_sq"] - f["link_s"] ** 2, 0.0) ** 0.5, 0.0)
    f["step_id"] = round(f["step_id"])
    return f
