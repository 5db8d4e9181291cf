"""Time to accuracy per method, from train.py's JSONL logs: a table, a headline and a plot.

    python scripts/summarize.py --plot out.png --markdown out.md none.jsonl gradpart.jsonl topk.jsonl

The first log is the reference (no compression): the targets are 95 % and 99 % of its final
test accuracy. For every run the table gives the training seconds after the first step
(evaluation excluded) and the steps at its first evaluation at or above each target
(``harness/progress.py``), the first step (tracing and compiling) on its own, its final
accuracy, its compression ratio (the compressor's own byte accounting), the bytes that crossed
rank 0's node link and, where train.py's ``--steps-jsonl`` log of every step lies beside the log
(``NAME.steps.jsonl``), its slowest step against its median step (a clock to trust has none far
above 1x). The plot draws test accuracy against training seconds and against steps, every
run on the same axes, with the targets as dashed lines.
"""
import argparse
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from harness.progress import epoch_records, slowest_step, targets, time_to_accuracy  # noqa: E402


def read(path):
    """A log's records, each tagged ``run``: the file's name without ``.jsonl`` (the demo names
    a log after its run, e.g. ``gradpart-warmup``, several of which may share a compressor)."""
    name = os.path.basename(path).removesuffix(".jsonl")
    with open(path) as f:
        return [dict(json.loads(line), run=name) for line in f if line.strip()]


def slowest(path):
    """``progress.slowest_step`` of the ``--log-every-steps 1`` log beside ``path``, or None."""
    steps = path.removesuffix(".jsonl") + ".steps.jsonl"
    if not os.path.exists(steps):
        return None
    with open(steps) as f:
        return slowest_step([json.loads(line) for line in f if line.strip()])


def row(records, goals, slowest=None):
    """One run's figures: ``reached`` maps each target share to a Reached or None."""
    last = epoch_records(records)[-1]
    comp = last.get("compression") or {}
    return {"method": last["run"], "final_acc": last["test_acc"], "epochs": last["epoch"],
            "train_s": last["train_s"], "first_step_s": last.get("first_step_s") or 0.0,
            "ratio": comp.get("compression_ratio", 1.0),
            "link_MB": (last["link_tx_bytes"] + last["link_rx_bytes"]) / 1e6, "slowest": slowest,
            "reached": {share: time_to_accuracy(records, goal) for share, goal in goals.items()}}


def cell(reached):
    return f"{reached.clock_s:.1f} s, {reached.step} steps" if reached else "not reached"


def table(rows, goals):
    """A Markdown table with padded columns, readable as plain text too."""
    header = ["method"] + [f"to {share:.0%} ({goal:.3f})" for share, goal in goals.items()] + [
        "first step", "final acc", "training s", "ratio", "link MB", "slowest step"]
    body = [[r["method"]] + [cell(r["reached"][share]) for share in goals] + [
        f"{r['first_step_s']:.1f} s", f"{r['final_acc']:.3f}", f"{r['train_s'] - r['first_step_s']:.1f}",
        f"{r['ratio']:.0f}x", f"{r['link_MB']:.1f}",
        "-" if r["slowest"] is None else f"{r['slowest']:.1f}x median"] for r in rows]
    widths = [max(len(line[i]) for line in [header] + body) for i in range(len(header))]
    lines = [[c.ljust(w) for c, w in zip(line, widths)] for line in [header] + body]
    lines.insert(1, ["-" * w for w in widths])
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def headline(rows):
    """One line per run against the reference (the first row): time to each target and link bytes."""
    ref = rows[0]
    out = []
    for r in rows[1:]:
        parts = []
        for share in sorted(ref["reached"], reverse=True):
            mine, theirs = r["reached"][share], ref["reached"][share]
            if mine is None:
                parts.append(f"{share:.0%} not reached")
            else:
                parts.append(f"{share:.0%} in {mine.clock_s:.1f} s vs {theirs.clock_s:.1f} s "
                             f"(speed-up {theirs.clock_s / mine.clock_s:.2f}x)")
        out.append(f"{r['method']} vs {ref['method']}: " + ", ".join(parts) + f"; final accuracy {r['final_acc']:.3f} "
                   f"after {r['epochs']} epochs, {ref['link_MB'] / r['link_MB']:.0f}x fewer link bytes.")
    return out


def plot(runs, goals, path, title):
    fig, (by_time, by_step) = plt.subplots(1, 2, figsize=(11, 4.2))
    for records in runs:
        name = records[-1]["run"]
        acc = [r["test_acc"] for r in records]
        by_time.plot([r["train_s"] - (r.get("first_step_s") or 0.0) for r in records], acc, marker=".", label=name)
        by_step.plot([r["step"] for r in records], acc, marker=".", label=name)
    for ax in (by_time, by_step):
        for share, goal in goals.items():
            ax.axhline(goal, color="grey", linestyle="--", linewidth=0.8)
            ax.annotate(f"{share:.0%} of {runs[0][-1]['run']}", (0, goal), xycoords=("axes fraction", "data"),
                        xytext=(3, 2), textcoords="offset points", fontsize=8, color="grey")
        ax.set_ylim(max(0.0, min(goals.values()) - 0.25), 1.0)
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    by_time.set(xlabel="training seconds after the first step (evaluation excluded)", ylabel="test accuracy")
    by_step.set(xlabel="steps", ylabel="test accuracy")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def probe_line(path):
    with open(path) as f:
        probe = json.load(f)
    return "Link (scripts/linkprobe.py, rank 0 <-> 1): latency {:.2f} ms, bandwidth {:.1f} MB/s".format(
        probe["latency_ms"]["1"], probe["bandwidth_MBps"]["1"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("logs", nargs="+", help="train.py --jsonl files; the first is the reference")
    p.add_argument("--title", default="")
    p.add_argument("--plot", help="PNG to write")
    p.add_argument("--markdown", help="Markdown file to write the same summary to")
    p.add_argument("--probe", help="linkprobe.py JSON to quote under the table")
    args = p.parse_args(argv)
    runs = [read(path) for path in args.logs]
    empty = [path for path, records in zip(args.logs, runs) if not records]
    if empty:
        p.error(f"no records in {', '.join(empty)}: did the training run finish?")
    goals = targets(runs[0])
    rows = [row(records, goals, slowest(path)) for path, records in zip(args.logs, runs)]
    lines = [f"**{args.title}**", "", table(rows, goals), ""] + headline(rows)
    if args.probe and os.path.exists(args.probe):
        lines += ["", probe_line(args.probe)]
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    if args.plot:
        plot(runs, goals, args.plot, args.title)


if __name__ == "__main__":
    main()
