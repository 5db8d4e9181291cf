"""Markdown table of bench_throughput.py rows: samples/s per method, model and link rate."""
import json
import sys
from collections import defaultdict


def main(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    groups = defaultdict(dict)
    for r in rows:
        groups[(r["model"], r["label"])][r["method"]] = r
    methods = [m for m in dict.fromkeys(r["method"] for r in rows) if m != "compute-only"]
    print("| model | link | compute-only bound | " + " | ".join(methods) + " |")
    print("|---|---|---|" + "---|" * len(methods))
    for (model, label), by in groups.items():
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
        print(f"| {model} | {label} | {bound:.0f} | " + " | ".join(cells) + " |")
    print("\nsamples/s over 2 ranks, median of timing windows after warm-up, all methods in one launch.")


if __name__ == "__main__":
    main(sys.argv[1])
