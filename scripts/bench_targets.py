"""The targets of the evaluation, checked against measured results: met or missed, by how much."""
import bench_results as br

PEERS = ("variance", "topk", "dgc", "sidco")
UNSHAPED = ("10gbit", "1gbit")


def _line(target, measured, met):
    return {"target": target, "measured": measured, "status": "met" if met else "missed"}


def mlp_bound(groups):
    """MLP at 100 Mbit/s: GradPart >= 0.8 of the compute-only bound and >= 40x no compression."""
    out = []
    for (model, label, ranks), by in groups.items():
        if model != "mlp" or label != "100mbit" or ranks != 2 or "gradpart" not in by:
            continue
        gp = by["gradpart"]["samples_per_s"]
        of_bound = gp / by["compute-only"]["samples_per_s"]
        vs_none = gp / by["none"]["samples_per_s"]
        out.append(_line("mlp, 100 Mbit/s: gradpart >= 0.8x compute-only bound",
                         f"{of_bound:.2f}x ({gp:.0f} samples/s)", of_bound >= 0.8))
        out.append(_line("mlp, 100 Mbit/s: gradpart >= 40x none", f"{vs_none:.1f}x", vs_none >= 40))
    return out


def best_peer(convergence):
    """Per model: GradPart's training samples/s against the fastest peer, with final accuracy."""
    out = []
    for model, runs in convergence.items():
        peers = [p for p in PEERS if p in runs]
        if "gradpart" not in runs or not peers:
            continue
        gp = br.summary_row("gradpart", runs["gradpart"])
        rows = [br.summary_row(p, runs[p]) for p in peers]
        best = max(rows, key=lambda r: r["samples_per_s"])
        faster = gp["samples_per_s"] > best["samples_per_s"]
        accurate = gp["test_acc"] >= best["test_acc"]
        out.append(_line(f"{model}: gradpart faster than the best peer at equal or better accuracy",
                         f"gradpart {gp['samples_per_s']:.0f} samples/s, acc {gp['test_acc']:.4f}; "
                         f"{best['run']} {best['samples_per_s']:.0f} samples/s, acc {best['test_acc']:.4f}",
                         faster and accurate))
    return out


def accuracy_and_ratio(convergence):
    """Every model: final accuracy within 0.5 pp of no compression; compression ratio >= 100x."""
    out = []
    for model, runs in convergence.items():
        if "gradpart" not in runs or br.REFERENCE not in runs:
            continue
        row = br.summary_row("gradpart", runs["gradpart"], runs[br.REFERENCE])
        out.append(_line(f"{model}: gradpart final accuracy within 0.5 pp of none",
                         f"{row['gap_pp']:+.1f} pp after {row['epochs']} epochs", row["gap_pp"] >= -0.5))
        out.append(_line(f"{model}: gradpart compression ratio >= 100x",
                         f"{row['ratio']:.0f}x (link counters: {row['link_ratio']:.1f}x)",
                         row["ratio"] >= 100))
    return out


def compute_bound(groups):
    """Compute-bound model on an unshaped link: GradPart at most 5 % slower than no compression."""
    out = []
    for (model, label, ranks), by in groups.items():
        if label not in UNSHAPED or ranks != 2 or not {"none", "gradpart"} <= set(by):
            continue
        none = by["none"]["samples_per_s"]
        if none < 0.7 * by["compute-only"]["samples_per_s"]:
            continue
        slower = 1 - by["gradpart"]["samples_per_s"] / none
        out.append(_line(f"{model}, {label} (compute-bound): gradpart <= 5 % slower than none",
                         f"{100 * slower:+.1f} % slower", slower <= 0.05))
    return out


def check(throughput_rows, convergence):
    """Every target line that the available results can decide."""
    groups = br.group_throughput(throughput_rows)
    return (mlp_bound(groups) + best_peer(convergence) + accuracy_and_ratio(convergence)
            + compute_bound(groups))
