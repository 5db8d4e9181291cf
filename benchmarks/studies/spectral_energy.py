"""Gradient energy per byte: low-rank factors against top-|g| coordinates on real matrix gradients.

    python -m benchmarks.studies.spectral_energy [--models mlp lenet5 resnet20 mobilenetv2]
        [--steps 300] [--record 2 50 150 300] [--out results/studies/spectral_energy]
    python -m benchmarks.studies.spectral_energy --summarize results/studies/spectral_energy.jsonl

Trains each model in one process as ``benchmarks.simulate`` does with one worker and no
compression (mnist5k, batch 32, seed 0, SGD 0.01 with momentum 0.9) and, at each recorded step,
takes every gradient that PowerSGD's ``view`` compresses (at least 1,024 elements, rank >= 2):
the matrix ``M`` of shape ``(out, fan_in)``, last axis out. Per matrix and budget, the bytes of
rank-``r`` factors, ``4 (out + fan_in) r`` (float32 ``P`` and ``Q``), buy instead
``k = bytes / 3.5`` coordinates (a float16 value and its position: docs/methods.md, "Wire
format", measures 2.9-3.5 bytes per value at 0.3-3 % density). The figure is the share of
``M``'s energy (sum of squares) captured: by the top-``k`` ``|M|`` (``coordinates``), by the exact
rank-``r`` SVD (``svd``), by one PowerSGD power step (``powersgd.power_step``) warm-started from
the exact top-``r`` right singular vectors of the gradient one step earlier (``warm``), and by the
best split of the bytes between rank ``j`` (exact SVD, ``j = 0..r``) and the top coordinates of
the remainder ``M - P Q^T`` (``both``; ``both_rank`` is its ``j``). Each record also holds the
effective rank ``exp(H)``, ``H`` the entropy of the normalized squared singular values. These
records (``"feedback": false``) score the raw gradient.

The records with ``"feedback": true`` run error feedback as each method would: every step, per
matrix, rank ``r`` in 1, 2, 4 and representation, ``acc = M + residual``, ``sent = compress(acc)``,
``residual = acc - sent``, each representation with its own residual, while the model trains on the
full gradient. The representations: the top-``k`` ``|acc|`` (``coordinates``); PowerSGD's warm
start, one (``warm``) or two (``warm2``) ``power_step`` per training step from the ``Q`` the last
one left (random at first, seed 0); the exact rank-``r`` truncation of ``acc`` (``svd``; above
256 rows and columns found by subspace iteration from the last step's vectors until its energy
settles, as a full SVD of the MLP's 1024 x 1024 matrix takes about 0.3 s). At the recorded
steps: the share of ``acc``'s energy that ``sent`` carries, and ``||residual|| / ||M||``
(``<method>_residual``). Energy captured is a proxy for what a representation is worth, not time
to accuracy.
"""
import argparse
import collections
import itertools
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HOROVOD_CYCLE_TIME", "0.1")  # each power_step allreduce waits one cycle (1 ms by default)

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks import simulate  # noqa: E402
from harness import training  # noqa: E402
from harness.data import batches, load_dataset  # noqa: E402
from harness.models import build_model  # noqa: E402
from hvd_gradpart.compressors.powersgd import PowerSGDCompressor, power_step  # noqa: E402

MODELS = ("mlp", "lenet5", "resnet20", "mobilenetv2")
RANKS = (1, 2, 4, 8)
FEEDBACK_RANKS = (1, 2, 4)
METHODS = ("coordinates", "warm", "warm2", "svd")  # with error feedback
POWER_STEPS = {"warm": 1, "warm2": 2}
DIRECT = 256                # "svd": a full SVD up to this many rows or columns, else subspace iteration
OVERSAMPLE = 8              # extra vectors of the subspace iteration
SETTLED = 1e-14             # its stop: the rank-r energy grew by less than this share
RECORD = (2, 50, 150, 300)  # from step 2 on, so that every recorded step has one before it
FLOAT_BYTES = 4             # P and Q travel as float32
BYTES_PER_VALUE = 3.5       # a float16 value and its position (module doc)
SEED = 0
FLATNESS = (0, 0.05, 0.1, 0.2, 0.4, 1)  # bins of exp(H) / min(out, fan_in) in the report
VIEW = PowerSGDCompressor(min_compression_rate=1.0)  # its view: every matrix that factors could shrink


def factor_bytes(out, fan_in, r):
    """Bytes of rank-``r`` float32 factors ``P`` (``out x r``) and ``Q`` (``fan_in x r``)."""
    return FLOAT_BYTES * (out + fan_in) * r


def matched_k(budget):
    """How many coordinates ``budget`` bytes buy."""
    return int(budget // BYTES_PER_VALUE)


def effective_rank(s):
    """``exp(H)``, ``H`` the entropy of the normalized squared singular values ``s``."""
    p = np.square(s) / np.sum(np.square(s))
    p = p[p > 0]
    return float(np.exp(-np.sum(p * np.log(p))))


def rank_energy(s, r):
    """Share of the energy that the exact rank-``r`` approximation captures."""
    return float(np.sum(np.square(s[:r])) / np.sum(np.square(s)))


def top_energy(matrix):
    """``e[k]``: the energy of the ``k`` largest ``|matrix|`` entries, for ``k = 0 .. size``."""
    return np.concatenate([[0.0], np.cumsum(np.sort(np.square(matrix, dtype=np.float64), axis=None)[::-1])])


def energy(matrix):
    """The sum of squares, in float64."""
    flat = np.asarray(matrix, np.float64).ravel()
    return float(flat @ flat)


def warm_energy(matrix, q):
    """Share of the energy that one power step from ``q`` (``fan_in x r``) captures."""
    total, _, _ = power_step(tf.constant(matrix.T, tf.float32), tf.constant(q, tf.float32))
    return energy(total.numpy()) / energy(matrix)


def fitting(out, fan_in, ranks):
    """The ``ranks`` whose factors are smaller than an ``out x fan_in`` matrix."""
    return [r for r in ranks if r <= min(out, fan_in) and (out + fan_in) * r < out * fan_in]


def budgets(matrix, u, s, vt, q_before):
    """Per rank ``r`` whose factors are smaller than ``matrix`` (``out x fan_in``, exact SVD ``u, s,
    vt``): the energy shares at ``r``'s bytes (module doc); ``q_before`` holds the previous
    step's right singular vectors as columns."""
    out, fan_in = matrix.shape
    ranks = fitting(out, fan_in, RANKS)
    total = float(np.sum(np.square(s)))
    rows = {r: {"rank": r, "bytes": factor_bytes(out, fan_in, r), "k": matched_k(factor_bytes(out, fan_in, r)),
                "dense_share": (out + fan_in) * r / (out * fan_in), "svd": rank_energy(s, r),
                "warm": warm_energy(matrix, q_before[:, :r]), "both": -1.0} for r in ranks}
    for j in range(max(ranks, default=-1) + 1):
        remainder = top_energy(matrix - (u[:, :j] * s[:j]) @ vt[:j])
        for r in (r for r in ranks if r >= j):
            k = matched_k(rows[r]["bytes"] - factor_bytes(out, fan_in, j))
            share = rank_energy(s, j) + remainder[min(k, remainder.size - 1)] / total
            if j == 0:
                rows[r]["coordinates"] = share
            if share > rows[r]["both"]:
                rows[r]["both"], rows[r]["both_rank"] = share, j
    return list(rows.values())


def top_coordinates(acc, k):
    """``acc`` with all but its ``k`` (>= 1) largest ``|acc|`` entries zeroed."""
    k = min(k, acc.size)
    keep = np.argpartition(np.abs(acc), acc.size - k, axis=None)[acc.size - k:]
    sent = np.zeros_like(acc)
    sent.flat[keep] = acc.flat[keep]
    return sent


def power_steps(acc, q, steps):
    """``steps`` of PowerSGD's ``power_step`` on ``acc`` (``out x fan_in``) from ``q`` (``fan_in x
    r``): the rank-``r`` matrix sent and the ``Q`` for the next training step."""
    m_t, q = tf.constant(acc.T, tf.float32), tf.constant(q, tf.float32)
    for _ in range(steps):
        total, _, q = power_step(m_t, q)
    return np.ascontiguousarray(total.numpy().T, np.float64), q.numpy()


def exact_rank(acc, v, r):
    """The exact rank-``r`` truncation of ``acc`` and the vectors to start from next: a full SVD
    when a side is at most ``DIRECT``, else subspace iteration from the columns of ``v``
    (``fan_in x b``, ``b > r``), Rayleigh-Ritz each round, until the rank-``r`` energy grows by
    less than ``SETTLED`` of itself."""
    if min(acc.shape) <= DIRECT:
        u, s, vt = np.linalg.svd(acc, full_matrices=False)
        return (u[:, :r] * s[:r]) @ vt[:r], v
    settled = -1.0
    while True:
        v = np.linalg.qr(v)[0]
        u, s, wt = np.linalg.svd(acc @ v, full_matrices=False)
        top = float(np.sum(np.square(s[:r])))
        if top - settled <= SETTLED * top:
            v = v @ wt.T
            return (u[:, :r] * s[:r]) @ v[:, :r].T, v
        settled, v = top, acc.T @ u


def compress(method, acc, state, r):
    """``method``'s ``sent`` for ``acc`` at rank ``r``'s bytes, and its state for the next step."""
    if method == "coordinates":
        return top_coordinates(acc, matched_k(factor_bytes(*acc.shape, r))), None
    if method == "svd":
        return exact_rank(acc, state, r)
    return power_steps(acc, state, POWER_STEPS[method])


def fresh(out, fan_in):
    """Error-feedback memory of an ``out x fan_in`` matrix: per ``(r, method)``, an empty
    residual and the method's starting state (a random ``Q`` or subspace, seed 0)."""
    start = np.random.default_rng(SEED).normal(size=(fan_in, max(FEEDBACK_RANKS) + OVERSAMPLE))
    extra = {"coordinates": None, "svd": OVERSAMPLE, **dict.fromkeys(POWER_STEPS, 0)}  # columns beyond r
    return {(r, m): (np.zeros((out, fan_in)), None if extra[m] is None else start[:, :r + extra[m]])
            for r in fitting(out, fan_in, FEEDBACK_RANKS) for m in METHODS}


def feedback(matrix, memory):
    """One training step of error feedback on ``matrix`` for every ``(r, method)`` in ``memory``:
    the memory after it and, per ``r``, each method's energy share of ``acc`` and residual norm."""
    after, rows, given = {}, {}, energy(matrix)
    for (r, method), (residual, state) in memory.items():
        acc = matrix + residual
        sent, state = compress(method, acc, state, r)
        residual = acc - sent
        after[r, method] = (residual, state)
        row = rows.setdefault(r, {"rank": r, "bytes": factor_bytes(*matrix.shape, r),
                                  "k": matched_k(factor_bytes(*matrix.shape, r)),
                                  "dense_share": sum(matrix.shape) * r / matrix.size})
        row[method] = energy(sent) / energy(acc)
        row[f"{method}_residual"] = np.sqrt(energy(residual) / given)
    return after, list(rows.values())


def matrices(model, grads):
    """``(index, name, M)`` of every gradient with a PowerSGD view, ``M`` as ``(out, fan_in)``
    float64, and the number of gradients of 1,024 elements or more that have none."""
    found, viewless = [], 0
    for i, (v, g) in enumerate(zip(model.trainable_variables, grads)):
        view = VIEW.view(g)
        if view is None:
            viewless += VIEW.sparsifies(g)
            continue
        fan_in, out, _ = view
        found.append((i, v.name, np.ascontiguousarray(np.reshape(g.numpy().astype(np.float64), [fan_in, out]).T)))
    return found, viewless


def study(name, steps, record):
    """Trains ``name`` for ``steps`` steps; returns one record per matrix and step in ``record``."""
    tf.keras.backend.clear_session()
    data = load_dataset("mnist5k", seed=SEED)
    tf.keras.utils.set_random_seed(SEED)
    model = build_model(name, data.x_train.shape[1:], data.num_classes, seed=SEED)
    step = simulate.make_step(model, simulate.make_optimizer("sgd", [], 1), [], 1)
    stream = itertools.chain.from_iterable(
        batches(data.x_train, data.y_train, simulate.BATCH, SEED, epoch) for epoch in itertools.count())
    memory, before, rows = {}, {}, []
    for done, (x, y) in enumerate(itertools.islice(stream, steps), 1):
        _, grads, _ = step(x[None], y[None])
        found, viewless = matrices(model, grads)
        for i, tensor, m in found:
            memory[i], fed = feedback(m, memory[i] if i in memory else fresh(*m.shape))
            row = {"model": name, "step": done, "index": i, "tensor": tensor,
                   "out": m.shape[0], "fan_in": m.shape[1], "elements": m.size}
            if done in record:
                rows.append({**row, "feedback": True, "budgets": fed})
            if done + 1 not in record and done not in record:
                continue
            u, s, vt = np.linalg.svd(m, full_matrices=False)
            if done in record:
                rows.append({**row, "feedback": False, "viewless": viewless, "effective_rank": effective_rank(s),
                             "budgets": budgets(m, u, s, vt, before[i])})
            before[i] = vt[:max(RANKS)].T
    return rows


def weighted_median(values, weights):
    """The value at which the cumulative weight, in value order, first reaches half."""
    order = np.argsort(values)
    cum = np.cumsum(np.asarray(weights, np.float64)[order])
    return float(np.asarray(values)[order][np.searchsorted(cum, cum[-1] / 2)])


def _median(cells, key):
    """The size-weighted median of ``key`` over ``(budget, elements)`` pairs."""
    return weighted_median([b[key] for b, _ in cells], [w for _, w in cells])


def _cells(rows, r):
    return [(b, row["elements"]) for row in rows for b in row["budgets"] if b["rank"] == r]


def summary(records):
    """Markdown: per model and budget, medians over matrices and steps weighted by size."""
    lines = ["| model | budget (bytes of rank r) | matrices x steps | bytes / dense | coordinates | rank r, SVD "
             "| rank r, warm power step | both, best split | split wins | SVD > coordinates |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for model, rows in _by_model(records).items():
        for r in RANKS:
            cells = _cells(rows, r)
            if not cells:
                continue
            med = lambda key: _median(cells, key)  # noqa: E731
            mixed = sum(0 < b["both_rank"] < r for b, _ in cells) / len(cells)
            wins = sum(b["svd"] > b["coordinates"] for b, _ in cells) / len(cells)
            lines.append(f"| {model} | r = {r} | {len(cells)} | {med('dense_share'):.3f} | {med('coordinates'):.3f} "
                         f"| {med('svd'):.3f} | {med('warm'):.3f} | {med('both'):.3f} | {mixed:.0%} | {wins:.0%} |")
    lines += ["", "| model | matrices | other gradients >= 1,024 elements (vectors, depthwise kernels) "
              "| elements in matrices | effective rank exp(H), median | exp(H) / min(out, fan_in), median |", "|---|---|---|---|---|---|"]
    for model, rows in _by_model(records).items():
        last = [row for row in rows if row["step"] == rows[-1]["step"]]
        weights = [row["elements"] for row in rows]
        lines.append(f"| {model} | {len(last)} | {last[0]['viewless']} | {sum(r['elements'] for r in last):,} "
                     f"| {weighted_median([r['effective_rank'] for r in rows], weights):.1f} "
                     f"| {weighted_median([r['effective_rank'] / min(r['out'], r['fan_in']) for r in rows], weights):.3f} |")
    return "\n".join(lines + ["", flatness(records)])


def feedback_summary(records):
    """Markdown, error feedback: per model and rank, size-weighted medians over matrices and
    steps of each method's energy share of ``acc`` and ``||residual|| / ||M||``, and the same per
    recorded step at r = 1 and r = 4."""
    medians = lambda cells, suffix="": " / ".join(f"{_median(cells, m + suffix):.3f}" for m in METHODS)  # noqa: E731
    lines = ["| model | r | matrices x steps | bytes / dense | energy of acc sent: coordinates / warm, 1 step "
             "/ warm, 2 steps / SVD | residual / gradient: the same | residual below coordinates': warm 1 / warm 2 "
             "/ SVD |", "|---|---|---|---|---|---|---|"]
    for model, rows in _by_model(records).items():
        for r in FEEDBACK_RANKS:
            cells = _cells(rows, r)
            below = " / ".join(f"{np.mean([b[m + '_residual'] < b['coordinates_residual'] for b, _ in cells]):.0%}"
                               for m in METHODS[1:])
            lines.append(f"| {model} | {r} | {len(cells)} | {_median(cells, 'dense_share'):.3f} | {medians(cells)} "
                         f"| {medians(cells, '_residual')} | {below} |")
    lines += ["", "| model | step | r = 1, energy of acc sent: coordinates / warm 1 / warm 2 / SVD "
              "| r = 1, residual / gradient | r = 4, energy of acc sent | r = 4, residual / gradient |",
              "|---|---|---|---|---|---|"]
    for model, rows in _by_model(records).items():
        for step in sorted({row["step"] for row in rows}):
            one, four = (_cells([row for row in rows if row["step"] == step], r) for r in (1, 4))
            lines.append(f"| {model} | {step} | {medians(one)} | {medians(one, '_residual')} | {medians(four)} "
                         f"| {medians(four, '_residual')} |")
    return "\n".join(lines)


def flatness(records, edges=FLATNESS):
    """Markdown: how often the SVD beats coordinates, by ``exp(H) / min(out, fan_in)``."""
    lines = ["| exp(H) / min(out, fan_in) | matrix-steps | SVD > coordinates at r = 1 | at r = 4 |", "|---|---|---|---|"]
    for lo, hi in zip(edges, edges[1:]):
        rows = [{b["rank"]: b for b in r["budgets"]} for r in records
                if lo <= r["effective_rank"] / min(r["out"], r["fan_in"]) < hi]
        share = lambda r: f"{np.mean([b[r]['svd'] > b[r]['coordinates'] for b in rows if r in b]):.0%}"  # noqa: E731
        lines.append(f"| {lo:g} - {hi:g} | {len(rows)} | {share(1)} | {share(4)} |")
    return "\n".join(lines)


def layers(records):
    """Markdown: per model, every matrix at the last recorded step."""
    out = []
    for model, rows in _by_model(records).items():
        out += [f"\n### {model}, step {rows[-1]['step']}\n",
                "| tensor | out x fan_in | exp(H) | r = 1: coordinates / SVD / warm "
                "| r = 4: coordinates / SVD / warm / both (its rank) |", "|---|---|---|---|---|"]
        for row in (r for r in rows if r["step"] == rows[-1]["step"]):
            b = {x["rank"]: x for x in row["budgets"]}
            cell = lambda r, keys: " / ".join(f"{b[r][k]:.2f}" for k in keys) if r in b else "–"  # noqa: E731
            four = cell(4, ("coordinates", "svd", "warm", "both")) + (f" ({b[4]['both_rank']})" if 4 in b else "")
            out.append(f"| {row['tensor']} | {row['out']} x {row['fan_in']} | {row['effective_rank']:.1f} "
                       f"| {cell(1, ('coordinates', 'svd', 'warm'))} | {four} |")
    return "\n".join(out)


def _by_model(records):
    groups = collections.defaultdict(list)
    for r in records:
        groups[r["model"]].append(r)
    return groups


def report(records):
    """The Markdown file: what was run, the summaries and the per-layer tables."""
    raw = [r for r in records if not r["feedback"]]
    steps = sorted({r["step"] for r in records})
    return (f"# Gradient energy per byte: low-rank factors against coordinates\n\n"
            f"`python -m benchmarks.studies.spectral_energy` (module doc): mnist5k, batch {simulate.BATCH}, "
            f"seed {SEED}, SGD {simulate.LR} with momentum 0.9, one process, no compression; recorded at steps "
            f"{', '.join(map(str, steps))}. Budgets: the bytes of float32 rank-r factors, 4 (out + fan_in) r; "
            f"coordinates at {BYTES_PER_VALUE} bytes each. Shares of the gradient's energy (sum of squares), "
            f"medians over matrices and steps weighted by elements; \"split wins\": the best split uses "
            f"0 < j < r (at r = 1, \"both\" is the better of the two alone); \"SVD > coordinates\": share of matrix-steps (unweighted). Energy captured is a "
            f"proxy, not time to accuracy.\n\n## Without error feedback\n\n{summary(raw)}\n\n## With error feedback\n\n"
            f"Every step, per matrix, rank r and method, its own residual: acc = gradient + residual, sent = "
            f"compress(acc), residual = acc - sent (module doc); the model trains on the full gradient. Shares of "
            f"acc's energy that sent carries, at the bytes of rank r; warm: PowerSGD's power_step, 1 or 2 per "
            f"training step, Q carried over (two steps put P and Q on the wire twice); SVD: the exact rank-r "
            f"truncation of acc. Each method has its own acc, so the residual / gradient (||residual|| / ||gradient||, lower is better) is the figure that compares them; \"residual below coordinates'\": share of matrix-steps (unweighted).\n\n"
            f"{feedback_summary([r for r in records if r['feedback']])}\n\n## Per layer, without error feedback\n"
            f"{layers(raw)}\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    p.add_argument("--steps", type=int, default=max(RECORD))
    p.add_argument("--record", type=int, nargs="+", default=RECORD, help="steps to record, each >= 2")
    p.add_argument("--out", default="results/studies/spectral_energy", help="path of the .jsonl and .md, less suffix")
    p.add_argument("--summarize", metavar="FILE", help="rewrite the .md beside a .jsonl and exit")
    args = p.parse_args(argv)
    if args.summarize:
        records = [json.loads(line) for line in open(args.summarize)]
        Path(args.summarize).with_suffix(".md").write_text(report(records))
        return
    if min(args.record) < 2:
        p.error("--record steps must be >= 2 (each needs the step before it)")
    training.limit_threads(1)
    hvd.init()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records = []
    for name in args.models:
        start = time.perf_counter()
        records += study(name, args.steps, set(args.record))
        print(f"{name}: {time.perf_counter() - start:.0f} s", flush=True)
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
    out.with_suffix(".md").write_text(report(records))


if __name__ == "__main__":
    main()
