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


def step_figures(raw, last_began):
    """This rank's figures of the last step from every gradient's stamps and counts.

    Args:
        raw: per gradient ``[began, left, arrived, sent_bytes, values, offered, elements,
            acc_energy, marginal_sq, dense]`` of the last step.
        last_began: the step before's first ``began`` (0: none yet).

    Returns:
        ``(began, figures)``: this step's first ``began``, and ``{step_s, link_s, compress_s,
        dense, sent_bytes, values, capped, elements, trained}`` (``step_s``
        0 when unknown; ``trained`` 0 when a gradient's accumulated energy was not finite: the
        step sent NaN in its place and every rank's optimizer skipped it; ``compress_s`` the
        compress passes' time, summed over gradients; ``capped`` the values offered over those
        sent, a geometric mean over the gradients that sent, by size: the ceiling holds for the
        bulk of the gradient when it is well above 1, the floor when well below).
    """
    began = min(r[0] for r in raw)
    link_s = max(0.0, max(r[2] for r in raw) - max(r[1] for r in raw))
    total = lambda i: sum(r[i] for r in raw)
    elements = total(6)
    sending = [r for r in raw if r[4] > 0.0 and r[9] < 0.5]
    weight = sum(r[6] for r in sending)
    capped = math.exp(sum(r[6] * math.log(max(r[5], 1.0) / r[4]) for r in sending) / weight) if weight else 1.0
    return began, {"step_s": began - last_began if last_began > 0.0 else 0.0, "link_s": link_s,
                   "compress_s": sum(max(r[1] - r[0], 0.0) for r in raw),
                   "dense": 1.0 if any(r[9] > 0.5 for r in raw) else 0.0, "sent_bytes": total(3),
                   "values": total(4), "capped": capped, "elements": elements,
                   "trained": float(all(math.isfinite(r[7]) for r in raw))}


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
