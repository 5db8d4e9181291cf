"""Tables of ``benchmarks.simulate --diagnose``'s per-step records (``benchmarks.diagnose``).

    python -m benchmarks.report --diagnose DIR

Markdown tables per model and optimizer from the ``*.jsonl`` evaluation records (``--out``) and
``*.steps.jsonl`` step records in ``DIR``: accuracy and density, the residual and the update, and
each rule's density per tensor.
"""
import collections
import glob
import json
import math
import os
import statistics


def _read(pattern):
    rows = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            rows.extend(json.loads(line) for line in f if line.strip())
    return rows


def _spread(values, digits=3):
    return f"{statistics.mean(values):.{digits}f} ± {(max(values) - min(values)) / 2:.{digits}f}"


def _epoch_of(record):
    return max(1, math.ceil(record["epoch"] - 1e-9))


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(x, spec=".3g"):
    return "–" if x is None else format(x, spec)


def tables(directory):
    """Markdown tables per (model, optimizer) from ``directory``'s evaluation and step records."""
    evals = collections.defaultdict(lambda: collections.defaultdict(list))  # (model, opt) -> run -> [record]
    for r in _read(os.path.join(directory, "*.jsonl")):
        if "test_acc" in r:
            evals[r["model"], r.get("optimizer", "sgd")][r["run"]].append(r)
    steps = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in _read(os.path.join(directory, "*.steps.jsonl")):
        steps[r["model"], r["optimizer"]][r["run"]].append(r)
    out = []
    for (model, opt), runs in sorted(evals.items()):
        out.append(f"### {model}, {opt}\n")
        out.append(_accuracy_table(runs, steps[model, opt]))
        out.append(_residual_table(runs, steps[model, opt]))
        out.append(_tensor_table(runs, steps[model, opt]))
    return "\n".join(out)


def _by_seed(records):
    seeds = collections.defaultdict(list)
    for r in records:
        seeds[r["seed"]].append(r)
    return {s: sorted(rs, key=lambda r: r["step"]) for s, rs in seeds.items()}


def _accuracy_table(runs, steps):
    """Per run: final test accuracy (mean ± half range over seeds); the median over seeds of
    the first evaluated step at 99 % of ``none``'s mean final accuracy; density over the run
    and per epoch (mean of the steps' densities); per seed the largest fall of test accuracy
    between consecutive evaluations from epoch 1 on, in points."""
    none = runs.get("none")
    target = 0.99 * statistics.mean(rs[-1]["test_acc"] for rs in _by_seed(none).values()) if none else None
    lines = ["| run | seeds | final accuracy | steps to 99 % of none (median; seeds reaching) | density, run "
             "| density per epoch | largest drop after ep 1, points (mean; worst seed) |",
             "|---|---|---|---|---|---|---|"]
    for run in _order(runs):
        seeds = _by_seed(runs[run])
        final = [rs[-1]["test_acc"] for rs in seeds.values()]
        reach = [next((r["step"] for r in rs if r["test_acc"] >= target), math.inf) for rs in seeds.values()] \
            if target else []
        reached = sum(math.isfinite(s) for s in reach)
        to_target = (f"{statistics.median(reach):g}" if math.isfinite(statistics.median(reach)) else "not reached") \
            if reach else "–"
        density = [rs[-1]["density_total"] for rs in seeds.values() if rs[-1].get("density_total")]
        per_epoch = collections.defaultdict(list)
        for r in steps.get(run, []):
            if r.get("density") is not None:
                per_epoch[_epoch_of(r)].append(r["density"])
        by_epoch = " / ".join(f"{statistics.mean(v):.2e}" for _, v in sorted(per_epoch.items())) or "–"
        drops = []
        for rs in seeds.values():
            late = [r for r in rs if r["epoch"] >= 1.0]
            drops.append(max([100 * (a["test_acc"] - b["test_acc"]) for a, b in zip(late, late[1:])] + [0.0]))
        lines.append(f"| {run} | {len(seeds)} | {_spread(final)} | {to_target} ({reached}/{len(reach)}) "
                     f"| {f'{statistics.mean(density):.2e}' if density else 'dense'} | {by_epoch} "
                     f"| {statistics.mean(drops):.1f}; {max(drops):.1f} |")
    return "\n".join(lines) + "\n"


def _residual_table(runs, steps):
    """Per run: worker 0's ``rg_all`` (median over steps and seeds) and its mean ``age_all``
    and ``age_mass`` in the first and the last epoch; the update over the averaged gradient's
    norm (median over steps, median over seeds); and, over the steps after epoch 1, that
    ratio's and the update norm's max/median per seed (start-up excluded: Adam's first step,
    momentum filling)."""
    lines = ["| run | ‖r‖/‖g‖ median, ep 1 → last | mean residual age (steps), ep 1 → last "
             "| mass-weighted age, ep 1 → last | ‖update‖/‖grad‖ median "
             "| its max/median after ep 1 (median seed; worst) | ‖update‖ max/median after ep 1 (median seed; worst) |",
             "|---|---|---|---|---|---|---|"]
    for run in _order(runs):
        records = steps.get(run, [])
        if not records:
            continue
        first, last = _first_last(records)
        pair = lambda key: (f"{_fmt(_median([r.get(key) for r in first]))} → "
                            f"{_fmt(_median([r.get(key) for r in last]))}")
        mean_pair = lambda key: " → ".join(
            _fmt(statistics.mean(v) if v else None, ".1f")
            for v in ([r[key] for r in part if r.get(key) is not None] for part in (first, last)))
        ratios, spikes, bursts = [], [], []
        for rs in _by_seed(records).values():
            ratios.append(statistics.median(r["update_norm"] / r["grad_norm"] for r in rs if r.get("grad_norm")))
            late = [r for r in rs if _epoch_of(r) > 1 and r.get("grad_norm")]
            u = [r["update_norm"] / r["grad_norm"] for r in late]
            spikes.append(max(u) / statistics.median(u))
            bursts.append(max(r["update_norm"] for r in late) / statistics.median(r["update_norm"] for r in late))
        residual = first[0].get("rg_all") is not None
        lines.append(f"| {run} | {pair('rg_all') if residual else '–'} "
                     f"| {mean_pair('age_all') if residual else '–'} | {mean_pair('age_mass') if residual else '–'} "
                     f"| {statistics.median(ratios):.3g} | {statistics.median(spikes):.2f}; {max(spikes):.2f} "
                     f"| {statistics.median(bursts):.2f}; {max(bursts):.2f} |")
    return "\n".join(lines) + "\n"


def _first_last(records):
    """The records of the first and of the last epoch."""
    last_epoch = max(_epoch_of(r) for r in records)
    return ([r for r in records if _epoch_of(r) == 1], [r for r in records if _epoch_of(r) == last_epoch])


def _tensor_table(runs, steps):
    """Per sparsified tensor of worker 0, each sparse run's density (epoch 1 → last) and median
    ``||r|| / ||g||`` in the last epoch: where each rule puts its bytes."""
    sparse = [run for run in _order(runs) if steps.get(run) and steps[run][0].get("tensors")]
    if not sparse:
        return ""
    names = steps[sparse[0]][0]["tensors"]
    lines = ["| tensor | elements | " + " | ".join(f"{run} density ep 1 → last" for run in sparse) + " | "
             + " | ".join(f"{run} ‖r‖/‖g‖ last ep" for run in sparse) + " |",
             "|---|---|" + "---|" * (2 * len(sparse))]
    for j, (key, _, n) in enumerate(names):
        cells, rg = [], []
        for run in sparse:
            first, last = _first_last(steps[run])
            mean = lambda part: statistics.mean(r["sent"][j] for r in part)
            cells.append(f"{mean(first):.2e} → {mean(last):.2e}")
            rg.append(_fmt(_median([r["rg"][j] for r in last])))
        lines.append(f"| {key} | {n} | " + " | ".join(cells) + " | " + " | ".join(rg) + " |")
    return "\n".join(lines) + "\n"


def _order(runs):
    return sorted(runs, key=lambda r: (r != "none", not r.startswith("gradpart"), r))
