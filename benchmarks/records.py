"""Reading benchmark result files and deriving the figures the report quotes.

Pure functions over the JSONL records written by ``scripts/train.py`` (per epoch, and per
gradient every few steps) and ``benchmarks/throughput.py`` (one row per method).
"""
import csv
import json
import math
import statistics
from pathlib import Path

REFERENCE = "none"
TARGET_SHARE = 0.95  # time-to-accuracy target: this share of the reference's final accuracy


def read_jsonl(path):
    """The JSON objects of a JSONL file, one per non-empty line."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def load_runs(folder):
    """``{model: {run name: per-epoch records}}`` from ``folder/<model>/<run>.jsonl``.

    train.py also writes a record at each evaluation within an epoch; only those closing an
    epoch (``epoch_end``, absent from older files) are kept here.
    """
    runs = {}
    for path in sorted(Path(folder).glob("*/*.jsonl")):
        if path.name.endswith(".tensors.jsonl"):
            continue
        records = [r for r in read_jsonl(path) if r.get("epoch_end", True)]
        if records:
            runs.setdefault(path.parent.name, {})[path.stem] = records
    return runs


def link_bytes(record):
    """Bytes that crossed rank 0's node link (both directions) since training began."""
    return record["link_tx_bytes"] + record["link_rx_bytes"]


def epoch_ratios(records):
    """Compression ratio of each epoch alone, from the compressor's byte accounting.

    Returns None for Horovod's dense compressors (no accounting).
    """
    if not records[0].get("compression"):
        return None
    ratios, dense0, sent0 = [], 0.0, 0.0
    for r in records:
        c = r["compression"]
        dense, sent = c["total_dense_bytes"] - dense0, c["total_sent_bytes"] - sent0
        ratios.append(dense / sent if sent else math.nan)
        dense0, sent0 = c["total_dense_bytes"], c["total_sent_bytes"]
    return ratios


def link_ratios(records, reference):
    """Per epoch: the reference run's link bytes over this run's, each epoch alone."""
    ratios = []
    for i, (r, ref) in enumerate(zip(records, reference)):
        before = link_bytes(records[i - 1]) if i else 0
        ref_before = link_bytes(reference[i - 1]) if i else 0
        mine = link_bytes(r) - before
        ratios.append((link_bytes(ref) - ref_before) / mine if mine else math.nan)
    return ratios


def steady_rate(records):
    """Median samples/s over the epochs after the first (which includes tracing)."""
    return statistics.median(r["samples_per_s"] for r in (records[1:] or records))


def summary_row(name, records, reference=None):
    """One run's final figures, with its gap to ``reference`` (records of no compression)."""
    last = records[-1]
    comp = last.get("compression") or {}
    row = {"run": name, "compressor": last["compressor"], "model": last["model"],
           "dataset": last["dataset"], "ranks": last["ranks"], "epochs": last["epoch"],
           "test_acc": last["test_acc"], "test_loss": last["test_loss"],
           "ratio": comp.get("compression_ratio", math.nan),
           "density": comp.get("last_density", math.nan),
           "link_MB": link_bytes(last) / 1e6, "samples_per_s": steady_rate(records),
           "wall_s": last["wall_s"]}
    if reference:
        ref = reference[min(len(reference), len(records)) - 1]
        row["gap_pp"] = 100 * (last["test_acc"] - ref["test_acc"])
        row["link_ratio"] = link_bytes(ref) / link_bytes(last) if link_bytes(last) else math.nan
        row["s_to_target"] = seconds_to(records, TARGET_SHARE * reference[-1]["test_acc"])
    return row


def seconds_to(records, accuracy):
    """Wall-clock seconds at the end of the first epoch reaching ``accuracy``; NaN if none did."""
    return next((r["wall_s"] for r in records if r["test_acc"] >= accuracy), math.nan)


def densities(tensor_records):
    """``{slot: (steps, densities)}``: each gradient's fraction sent, per logged step."""
    out = {}
    for rec in tensor_records:
        for slot, m in rec["tensors"].items():
            steps, values = out.setdefault(slot, ([], []))
            steps.append(rec["step"])
            values.append(m["sent_elements"] / m["elements"] if m.get("elements") else math.nan)
    return out


def slot_sizes(tensor_records):
    """``{slot: elements}`` from the first record."""
    return {slot: int(m.get("elements", 0)) for slot, m in tensor_records[0]["tensors"].items()}


def group_throughput(rows):
    """``{(model, label, ranks): {method: row}}`` in first-seen order."""
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["label"], r.get("ranks", 2)), {})[r["method"]] = r
    return groups


def fmt(value, spec):
    """``value`` formatted with ``spec``; a dash for None or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return format(value, spec)


def markdown(rows, columns):
    """A Markdown table; ``columns`` is a list of (header, key, format spec)."""
    lines = ["| " + " | ".join(h for h, _, _ in columns) + " |",
             "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(k), spec) for _, k, spec in columns) + " |")
    return "\n".join(lines)


def write_csv(rows, path):
    """Writes ``rows`` (dicts) as CSV with the union of their keys as header."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


def load_seeds(folder):
    """``{model: {seed: {run name: records}}}`` from ``folder/seed<k>/<model>/<run>.jsonl``."""
    out = {}
    for seed_dir in sorted(Path(folder).glob("seed*")):
        for model, runs in load_runs(seed_dir).items():
            out.setdefault(model, {})[int(seed_dir.name[4:])] = runs
    return out


def gap_row(model, by_seed, run="gradpart"):
    """Final accuracies of ``run`` and of the reference over the seeds that have both: their
    means, the mean gap (pp) with its spread, and ``run``'s mean compression ratio, from its
    compressor's accounting and from the link counters."""
    seeds = sorted(s for s, runs in by_seed.items() if {run, REFERENCE} <= set(runs))
    if not seeds:
        return None
    rows = [summary_row(run, by_seed[s][run], by_seed[s][REFERENCE]) for s in seeds]
    gaps = [r["gap_pp"] for r in rows]
    return {"model": model, "run": run, "seeds": len(seeds), "epochs": rows[0]["epochs"],
            "none_acc": statistics.mean(by_seed[s][REFERENCE][-1]["test_acc"] for s in seeds),
            "test_acc": statistics.mean(r["test_acc"] for r in rows),
            "gap_pp": statistics.mean(gaps), "gap_sd": statistics.stdev(gaps) if len(gaps) > 1 else 0.0,
            "gap_min": min(gaps), "gap_max": max(gaps),
            "ratio": statistics.mean(r["ratio"] for r in rows),
            "link_ratio": statistics.mean(r["link_ratio"] for r in rows)}
