"""Tables and plots from train.py's JSONL logs.

    python scripts/summarize.py --plot out.png --markdown out.md run1.jsonl run2.jsonl
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def row(records):
    last = records[-1]
    comp = last.get("compression") or {}
    link = last["link_tx_bytes"] + last["link_rx_bytes"]
    return {"method": last["compressor"], "model": last["model"], "epochs": last["epoch"],
            "test_acc": last["test_acc"],
            "ratio": comp.get("compression_ratio", 1.0),
            "samples_per_s": max(r["samples_per_s"] for r in records[1:] or records),
            "link_MB": link / 1e6, "wall_s": last["wall_s"]}


def markdown(rows, title):
    lines = [f"**{title}**", "",
             "| method | model | epochs | test accuracy | compression ratio | samples/s | bytes on link (MB, rank 0 node) | wall (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['model']} | {r['epochs']} | {r['test_acc']:.4f} | "
                     f"{r['ratio']:.1f}x | {r['samples_per_s']:.0f} | {r['link_MB']:.1f} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def plot(runs, path, title):
    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(10, 4))
    for records in runs:
        name = records[-1]["compressor"]
        by_epoch.plot([r["epoch"] for r in records], [r["test_acc"] for r in records], marker="o", label=name)
        by_time.plot([r["wall_s"] for r in records], [r["test_acc"] for r in records], marker="o", label=name)
    by_epoch.set(xlabel="epoch", ylabel="test accuracy")
    by_time.set(xlabel="wall-clock seconds", ylabel="test accuracy")
    for ax in (by_epoch, by_time):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("logs", nargs="+")
    p.add_argument("--title", default="")
    p.add_argument("--plot")
    p.add_argument("--markdown")
    p.add_argument("--probe", help="linkprobe.py JSON to quote under the table")
    args = p.parse_args()
    runs = [read(path) for path in args.logs]
    table = markdown([row(r) for r in runs], args.title)
    if args.probe and os.path.exists(args.probe):
        with open(args.probe) as f:
            probe = json.load(f)
        table += "\n\nLink (scripts/linkprobe.py, rank 0 <-> 1): latency {:.2f} ms, bandwidth {:.1f} MB/s".format(
            probe["latency_ms"]["1"], probe["bandwidth_MBps"]["1"])
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    if args.plot:
        plot(runs, args.plot, args.title)


if __name__ == "__main__":
    main()
