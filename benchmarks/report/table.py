"""Markdown table of benchmarks.throughput rows: samples/s per method, model and link rate.

    python -m benchmarks.report --table results/throughput.jsonl
"""
from benchmarks.records import group_throughput

NOTE = ("samples/s over all ranks, median of timing windows after warm-up, all methods in one launch; "
        "groups: Horovod groups per step (1: every gradient in one group; per tensor: no groups).")


def grouping(by):
    """The groups column of one launch's rows (rows from before the field are per tensor)."""
    found = {r.get("num_groups", 0) for r in by.values()}
    return "/".join("per tensor" if g == 0 else str(g) for g in sorted(found))


def table(rows):
    """The Markdown table of ``rows``, one line per model, link label and rank count."""
    groups = group_throughput(rows)
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "compute-only"]
    lines = ["| model | link | ranks | groups | compute-only bound | " + " | ".join(methods) + " |",
             "|---|---|---|---|---|" + "---|" * len(methods)]
    for (model, label, ranks), by in groups.items():
        if "compute-only" not in by:
            continue
        bound = by["compute-only"]["samples_per_s"]
        none = by.get("none", {}).get("samples_per_s")
        cells = []
        for m in methods:
            if m not in by:
                cells.append("–")
                continue
            sps = by[m]["samples_per_s"]
            vs_none = f", {sps / none:.1f}x none" if none and m != "none" else ""
            cells.append(f"{sps:.0f} ({sps / bound:.2f} of bound{vs_none})")
        lines.append(f"| {model} | {label} | {ranks} | {grouping(by)} | {bound:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n\n" + NOTE
