"""The benchmark figures (matplotlib, Agg); each function writes one PNG."""
import math

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402

from benchmarks import records as br, scaling  # noqa: E402


def _save(fig, path, title):
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


COLORS = {"none": "black", "fp16": "tab:gray", "topk": "tab:green", "variance": "tab:purple",
          "dgc": "tab:orange", "sidco": "tab:brown", "gradpart": "tab:red", "powersgd": "tab:blue",
          "no-fit": "tab:blue", "no-partition": "tab:cyan", "no-entropy": "tab:olive", "no-predict": "tab:pink"}


def _style(name):
    """One colour per method everywhere; GradPart drawn bold so it stands out."""
    width = {"linewidth": 2.6, "zorder": 3} if name == "gradpart" else {"linewidth": 1.3}
    return {"color": COLORS.get(name), **width}


def convergence(runs, path, title):
    """Test accuracy and loss against epoch and against wall-clock seconds."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for name, records in runs.items():
        epochs = [r["epoch"] for r in records]
        wall = [r["wall_s"] for r in records]
        for row, key in enumerate(("test_acc", "test_loss")):
            values = [r[key] for r in records]
            axes[row][0].plot(epochs, values, marker="o", label=name, **_style(name))
            axes[row][1].plot(wall, values, marker="o", label=name, **_style(name))
    for row, label in enumerate(("test accuracy", "test loss")):
        axes[row][0].set(xlabel="epoch", ylabel=label)
        axes[row][1].set(xlabel="wall-clock seconds", ylabel=label)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    _save(fig, path, title)


def ratios(runs, path, title):
    """Compression ratio per epoch: compressor's accounting and link counters (log scale)."""
    fig, (by_comp, by_link) = plt.subplots(1, 2, figsize=(11, 4))
    reference = runs.get(br.REFERENCE)
    for name, records in runs.items():
        epochs = [r["epoch"] for r in records]
        own = br.epoch_ratios(records)
        if own:
            by_comp.plot(epochs, own, marker="o", label=name, **_style(name))
        if reference and name != br.REFERENCE:
            by_link.plot(epochs[:len(reference)], br.link_ratios(records, reference), marker="o",
                         label=name, **_style(name))
    by_comp.set(xlabel="epoch", ylabel="dense bytes / bytes sent", yscale="log",
                title="compressor's accounting (sparsified tensors)")
    by_link.set(xlabel="epoch", ylabel="link bytes of none / link bytes", yscale="log",
                title="link counters (everything on the wire)")
    for ax in (by_comp, by_link):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    _save(fig, path, title)


def throughput(rows, path, title):
    """Samples/s bars per method, one panel per model and link, compute-only bound dashed."""
    groups = br.group_throughput(rows)
    cols = min(4, len(groups))
    rows_ = math.ceil(len(groups) / cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(max(5.0, 3.6 * cols), 4.2 * rows_), squeeze=False)
    for ax in axes.flat[len(groups):]:
        ax.set_visible(False)
    for ax, ((model, label, ranks), by) in zip(axes.flat, groups.items()):
        methods = [m for m in by if m != "compute-only"]
        values = [by[m]["samples_per_s"] for m in methods]
        colors = [COLORS.get(m, "tab:blue") for m in methods]
        ax.bar_label(ax.bar(methods, values, color=colors), fmt="%.0f", fontsize=7)
        if "compute-only" in by:
            bound = by["compute-only"]["samples_per_s"]
            ax.axhline(bound, color="k", linestyle="--")
            ax.annotate(f"compute-only {bound:.0f}", (0.02, bound), xycoords=("axes fraction", "data"),
                        xytext=(0, 3), textcoords="offset points", fontsize=7)
        top = max(values + [by.get("compute-only", {}).get("samples_per_s", 0)])
        log = top > 10 * min(values)  # log scale only where the bars span a decade
        ax.set(title=f"{model}, {label}, {ranks} ranks", ylabel="samples/s",
               yscale="log" if log else "linear")
        ax.set_ylim(0.5 * min(values) if log else 0, (2.5 if log else 1.15) * top)
        ax.tick_params(axis="x", rotation=60)
        ax.grid(alpha=0.3, axis="y", which="both")
    _save(fig, path, title)


def _elements(n):
    """``n`` elements in short: 1k, 10k, 1M."""
    return f"{n / 1e6:g}M" if n >= 1e6 else f"{n / 1e3:g}k" if n >= 1e3 else f"{n:g}"


def density(tensor_records, path, title):
    """GradPart's fraction sent over training steps: the whole model's, with the least and the
    largest layer's as a faint band (left), and per decade of layer size (right), each the
    fraction of its layers' elements sent."""
    sizes = br.slot_sizes(tensor_records)
    per_slot = br.densities(tensor_records)
    steps = next(iter(per_slot.values()))[0]
    layers = np.array([values for _, values in per_slot.values()])  # [layer, logged step]
    size = np.array([sizes[slot] for slot in per_slot], dtype=float)[:, None]
    weighted = lambda rows: np.nansum(layers[rows] * size[rows], 0) / np.sum(size[rows] * np.isfinite(layers[rows]), 0)
    fig, (whole, by_size) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    whole.fill_between(steps, np.nanmin(layers, 0), np.nanmax(layers, 0), color=COLORS["gradpart"], alpha=0.15,
                       linewidth=0, label=f"least to largest of {len(layers)} layers")
    whole.plot(steps, weighted(slice(None)), label="all layers", **_style("gradpart"))
    whole.set(title="whole model", xlabel="training step", ylabel="fraction sent", yscale="log")
    decades = np.floor(np.log10(size[:, 0])).astype(int)
    for decade in sorted(set(decades)):
        rows = decades == decade
        by_size.plot(steps, weighted(rows), linewidth=1.6,
                     label=f"{_elements(10 ** decade)} to {_elements(10 ** (decade + 1))} elements "
                           f"({rows.sum()} layer{'s' if rows.sum() > 1 else ''})")
    by_size.set(title="by layer size", xlabel="training step")
    for ax in (whole, by_size):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="lower right")
    _save(fig, path, title)


def ablation(rows, path, title):
    """Final accuracy, compression ratio and samples/s per ablation variant."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 4))
    names = [r["run"] for r in rows]
    colors = [COLORS.get(n, "tab:gray") for n in names]
    for ax, key, label, log, spec in ((axes[0], "test_acc", "final test accuracy", False, "%.3f"),
                                      (axes[1], "ratio", "compression ratio", True, "%.0f"),
                                      (axes[2], "samples_per_s", "samples/s", False, "%.0f")):
        values = [r[key] for r in rows]
        ax.bar_label(ax.bar(names, values, color=colors), fmt=spec, fontsize=7)
        if key == "test_acc":
            finite = [v for v in values if not math.isnan(v)]
            ax.set_ylim(max(0.0, min(finite) - 0.05), min(1.0, max(finite) + 0.02))
        ax.set(ylabel=label, yscale="log" if log else "linear")
        ax.tick_params(axis="x", rotation=45)
        ax.grid(alpha=0.3, axis="y")
    _save(fig, path, title)


def scaling_curves(constants, measured, path, title, rates=("20mbit", "100mbit", "1gbit")):
    """Predicted step time against node count, dense against sparse, with measured points."""
    fig, ax = plt.subplots(figsize=(10, 4.5))
    nodes = [2, 4, 8, 16, 32, 64, 128]
    for label, color in zip(rates, ("tab:purple", "tab:blue", "tab:green")):
        b = scaling.rate_bytes(label)
        for method, style in (("dense", "--"), ("sparse", "-")):
            ax.plot(nodes, [scaling.step_time(constants, method, n, b) for n in nodes], style,
                    color=color, label=f"{method}, {label}")
    for method, marker in (("dense", "s"), ("sparse", "o")):
        points = sorted((n, t) for (m, n), t in measured.items() if m == method)
        if points:
            ax.plot(*zip(*points), marker, color="k", label=f"{method}, measured (shared cores)")
    ax.set(xlabel="nodes N", ylabel="seconds per step (model)", xscale="log", yscale="log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    _save(fig, path, title)


def _clock(records):
    """Training seconds after the first step at each evaluation (at least 10 ms, for the log axis)."""
    return [max(r["train_s"] - r["first_step_s"], 1e-2) for r in records]


def _band(ax, runs, color, label):
    """Fills the range of test accuracy ``runs`` (lists of records) reach at each training second,
    each run interpolated linearly in log seconds over its own span."""
    curves = [(np.log(_clock(records)), [r["test_acc"] for r in records]) for records in runs]
    grid = np.linspace(min(x[0] for x, _ in curves), max(x[-1] for x, _ in curves), 300)
    reached = np.array([np.where((grid >= x[0]) & (grid <= x[-1]), np.interp(grid, x, y), np.nan) for x, y in curves])
    some = np.isfinite(reached).any(0)
    lo = np.min(np.where(np.isfinite(reached), reached, np.inf), 0)
    hi = np.max(np.where(np.isfinite(reached), reached, -np.inf), 0)
    ax.fill_between(np.exp(grid[some]), lo[some], hi[some], color=color, alpha=0.13, linewidth=0, label=label)


def time_to_accuracy(panels, path, title):
    """Test accuracy against training seconds after the first step (log axis): a column per link,
    GradPart against the fastest above and against the other peers below.

    Above: no compression, GradPart, the best tuned Top-k with the whole Top-k grid as a faint
    band, and the fastest other peer. Below: no compression and GradPart again, with every
    other peer. No panel draws more than a handful of lines.

    Args:
        panels: ``{link: (runs, goals)}``: ``runs`` maps each method to one run's records, fastest
            first as the time-to-accuracy table orders them (so the first Top-k run is the best
            tuned one); ``goals`` each target share to its accuracy, drawn dotted.
    """
    fig, axes = plt.subplots(2, len(panels), figsize=(2 + 5 * len(panels), 8.8), squeeze=False, sharex="col",
                             sharey=True)
    for col, (link, (runs, goals)) in enumerate(panels.items()):
        grid = [name for name, records in runs.items() if records[0].get("compressor") == "topk"]
        peers = [name for name in runs if name not in grid and name not in (br.REFERENCE, "gradpart")]
        ends = [name for name in (br.REFERENCE, "gradpart") if name in runs]
        rows = ((f"{link}: GradPart against the fastest", [*ends, *grid[:1], *peers[:1]]),
                (f"{link}: against the other peers", [*ends, *peers[1:]]))
        for row, (ax, (heading, names)) in enumerate(zip(axes[:, col], rows)):
            if row == 0 and len(grid) > 1:
                _band(ax, [runs[name] for name in grid], COLORS["topk"], f"Top-k grid ({len(grid)} densities)")
            for name in names:
                label = f"best tuned Top-k: {name}" if name in grid else name
                ax.plot(_clock(runs[name]), [r["test_acc"] for r in runs[name]], marker=".", label=label,
                        **_style("topk" if name in grid else name))
            for share, goal in goals.items():
                ax.axhline(goal, color="grey", linestyle=":", linewidth=0.9)
                ax.annotate(f"{share:.0%} of none", (0, goal), xycoords=("axes fraction", "data"), xytext=(3, 2),
                            textcoords="offset points", fontsize=7, color="grey")
            ax.set(xscale="log", title=heading)
            ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            ax.set_ylim(max(0.0, min(goals.values()) - 0.3), 1.0)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7, loc="lower right")  # each panel's own: the best Top-k and peers differ by link
    for ax in axes[:, 0]:
        ax.set_ylabel("test accuracy")
    for ax in axes[1]:
        ax.set_xlabel("training seconds after the first step")
    _save(fig, path, title)
