"""Analytic step time against node count N and link bandwidth B, calibrated on a 2-node run.

Per step and rank (bytes; B in bytes/s, eta the link efficiency measured with dense training):

    dense ring allreduce   T_d(N, B) = T_c + V_d(N) / (eta B),   V_d(N) = 2 (N-1)/N * M
    sparse allgather       T_s(N, B) = T_c + o_s N/2 + V_s(N) / (eta B),
                           V_s(N) = (N-1) s + 2 (N-1)/N * m

T_c is the compute-only step, M the dense gradient bytes, s the bytes one rank's sparse payloads
take (the compressor's accounting), m the bytes of tensors too small to sparsify (they stay
dense), o_s the sparse path's fixed cost at N = 2 (coordination, latency of one collective per
tensor, compress and decompress), taken to grow with N because every rank decodes N payloads.
"""
import math
import re
from dataclasses import dataclass

_UNITS = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}


def rate_bytes(label):
    """Bytes/s of a tc rate label such as ``100mbit``; None when it is not one."""
    m = re.fullmatch(r"(\d+)(kbit|mbit|gbit)", label or "")
    return int(m.group(1)) * _UNITS[m.group(2)] / 8 if m else None


@dataclass(frozen=True)
class Constants:
    """What the model needs, measured on one model at one link rate with 2 ranks."""

    model: str
    batch: int            # samples per rank per step
    t_compute: float      # s, compute-only step
    dense_bytes: float    # M
    sparse_bytes: float   # s
    small_bytes: float    # m
    bandwidth: float      # bytes/s of the calibration link
    efficiency: float     # eta
    overhead: float       # o_s at N = 2, s


def calibrate(group, bandwidth, sparse="gradpart"):
    """Constants from one launch's rows (``{method: row}``, 2 ranks, a comm-bound link)."""
    bound, dense, sp = group["compute-only"], group["none"], group[sparse]
    comp = sp["compression"]
    total = 4.0 * dense["params"]
    t_c = bound["step_s"]
    efficiency = min(1.0, total / (bandwidth * max(dense["step_s"] - t_c, 1e-9)))
    small = max(total - comp["last_dense_bytes"], 0.0)
    c = Constants(model=dense["model"], batch=dense["batch_per_rank"], t_compute=t_c,
                  dense_bytes=total, sparse_bytes=comp["last_sent_bytes"], small_bytes=small,
                  bandwidth=bandwidth, efficiency=efficiency, overhead=0.0)
    volume = sparse_volume(c, 2) / (efficiency * bandwidth)
    return Constants(**{**c.__dict__, "overhead": max(sp["step_s"] - t_c - volume, 0.0)})


def dense_volume(c, n):
    return 2 * (n - 1) / n * c.dense_bytes


def sparse_volume(c, n):
    return (n - 1) * c.sparse_bytes + 2 * (n - 1) / n * c.small_bytes


def step_time(c, method, n, bandwidth, t_compute=None):
    """Predicted seconds per step of ``method`` ("dense" or "sparse")."""
    t_c = c.t_compute if t_compute is None else t_compute
    link = c.efficiency * bandwidth
    if method == "dense":
        return t_c + dense_volume(c, n) / link
    return t_c + c.overhead * n / 2 + sparse_volume(c, n) / link


def break_even_bandwidth(c, n):
    """Bandwidth (bytes/s) above which dense allreduce is faster at ``n`` nodes; inf when the
    sparse path has no fixed cost, 0 when it never pays."""
    saved = dense_volume(c, n) - sparse_volume(c, n)
    if saved <= 0:
        return 0.0
    if c.overhead <= 0:
        return math.inf
    return saved / (c.efficiency * c.overhead * n / 2)


def break_even_nodes(c, bandwidth, limit=4096):
    """Smallest N >= 2 at which the sparse step is no faster than dense; None up to ``limit``."""
    for n in range(2, limit + 1):
        if step_time(c, "sparse", n, bandwidth) >= step_time(c, "dense", n, bandwidth):
            return n
    return None


def prediction_rows(c, nodes, rates):
    """Predicted samples/s of both exchanges per node count and rate label."""
    rows = []
    for label in rates:
        b = rate_bytes(label)
        for n in nodes:
            d, s = step_time(c, "dense", n, b), step_time(c, "sparse", n, b)
            rows.append({"link": label, "nodes": n, "dense_sps": c.batch * n / d,
                         "sparse_sps": c.batch * n / s, "speedup": d / s,
                         "sparse_of_bound": c.t_compute / s})
    return rows
