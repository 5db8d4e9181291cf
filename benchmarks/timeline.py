"""The collectives a Horovod timeline shows, as counts and durations.

Horovod's timeline (``HOROVOD_TIMELINE``, or ``hvd.start_timeline`` when it is ``DYNAMIC``) is a
Chrome trace: one trace "process" per tensor, named after it, holding nested ``B``/``E`` events
(``NEGOTIATE_ALLGATHER``, ``ALLGATHER``, then the backend's ``GLOO_ALLGATHER`` or
``MPI_ALLGATHER`` inside it, ...). Tensors Horovod fused into one collective each get their own
backend event, a few microseconds apart; Horovod's background thread runs one collective at a
time, so backend events of one op whose spans overlap are one collective, with as many tensors
as took part. With ``mark_cycles`` Horovod also marks each cycle's start (``CYCLE_START``): the
collectives one cycle agreed on run back to back, so the cycles that hold a collective are the
step's collective rounds, each of which waited for Horovod's cycle.
"""
import bisect
import json
import statistics
from collections import defaultdict

BACKENDS = ("GLOO_", "MPI_", "NCCL_")


def load(path):
    """The events of a timeline file (Horovod leaves the array open while it writes)."""
    text = open(path).read().rstrip().rstrip(",")
    return json.loads(text if text.endswith("]") else text + "]")


def collectives(events):
    """``[(op, begin_us, duration_us, tensors)]`` of every backend collective, by begin time."""
    open_events = defaultdict(list)  # trace pid -> stack of (name, ts)
    spans = []  # (op, begin, end), one per tensor
    for event in events:
        phase, pid = event.get("ph"), event.get("pid")
        if phase == "B":
            open_events[pid].append((event["name"], event["ts"]))
        elif phase == "E" and open_events[pid]:
            name, begin = open_events[pid].pop()
            if name.startswith(BACKENDS):
                spans.append((name, begin, event["ts"]))
    found = []  # [op, begin, end, tensors]
    for op, begin, end in sorted(spans, key=lambda s: (s[0], s[1])):
        if found and found[-1][0] == op and begin <= found[-1][2]:
            found[-1][2], found[-1][3] = max(found[-1][2], end), found[-1][3] + 1
        else:
            found.append([op, begin, end, 1])
    return sorted(((op, begin, end - begin, n) for op, begin, end, n in found), key=lambda c: c[1])


def rounds(events, found, steps):
    """Cycles per step that ran at least one of the collectives ``found``, or None when the
    timeline marks no cycle."""
    starts = sorted(e["ts"] for e in events if e.get("name") == "CYCLE_START")
    if not starts:
        return None
    return round(len({bisect.bisect_right(starts, begin) for _, begin, _, _ in found}) / steps, 2)


def per_step(found, steps):
    """Collectives per step by op: ``{op: {"per_step", "tensors_each", "median_ms"}}``."""
    by_op = defaultdict(list)
    for op, _, duration, tensors in found:
        by_op[op].append((duration, tensors))
    return {op: {"per_step": round(len(rows) / steps, 2),
                 "tensors_each": round(statistics.mean(t for _, t in rows), 2),
                 "median_ms": round(statistics.median(d for d, _ in rows) / 1e3, 3)}
            for op, rows in sorted(by_op.items())}
