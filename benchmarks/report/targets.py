"""The targets of the evaluation, checked against measured results: met or missed, by how much."""
from benchmarks import records as br

PEERS = ("variance", "topk", "dgc", "sidco", "powersgd")
UNSHAPED = ("10gbit", "1gbit")
MANY_TENSORS = ("resnet44",)  # 100+ gradient tensors: 10 % slower than none allowed, any bound


def _line(target, measured, met):
    return {"target": target, "measured": measured, "status": "met" if met else "missed"}


def mlp_bound(groups):
    """MLP at 100 Mbit/s: GradPart >= 0.8 of the compute-only bound and >= 40x no compression."""
    out = []
    for (model, label, ranks), by in groups.items():
        complete = {"compute-only", "none", "gradpart"} <= set(by)
        if (model, label, ranks) != ("mlp", "100mbit", 2) or not complete:
            continue
        gp = by["gradpart"]["samples_per_s"]
        of_bound = gp / by["compute-only"]["samples_per_s"]
        vs_none = gp / by["none"]["samples_per_s"]
        out.append(_line("mlp, 100 Mbit/s: gradpart >= 0.8x compute-only bound",
                         f"{of_bound:.2f}x ({gp:.0f} samples/s)", of_bound >= 0.8))
        out.append(_line("mlp, 100 Mbit/s: gradpart >= 40x none", f"{vs_none:.1f}x", vs_none >= 40))
    return out


def _speeds(model, groups, convergence):
    """Samples/s per method of ``model``: the 100 Mbit/s throughput launch (all methods in one
    launch) when there is one, else the training runs (separate launches, noisier)."""
    by = groups.get((model, "100mbit", 2))
    if by and "gradpart" in by:
        return {m: r["samples_per_s"] for m, r in by.items()}, "throughput launch, 100 Mbit/s"
    runs = convergence.get(model, {})
    return {m: br.steady_rate(r) for m, r in runs.items()}, "training runs, separate launches"


def best_peer(groups, convergence):
    """Per model: GradPart's samples/s against the fastest peer, final accuracies from training."""
    out = []
    for model in dict.fromkeys([k[0] for k in groups] + list(convergence)):
        speeds, source = _speeds(model, groups, convergence)
        peers = [p for p in PEERS if p in speeds]
        runs = convergence.get(model, {})
        if "gradpart" not in speeds or not peers:
            continue
        best = max(peers, key=speeds.get)
        measured = f"gradpart {speeds['gradpart']:.0f}, {best} {speeds[best]:.0f} samples/s ({source})"
        if "gradpart" not in runs or best not in runs:
            out.append({**_line(f"{model}: gradpart faster than the best peer at equal or better accuracy",
                                measured + "; accuracy not measured", False), "status": "open"})
            continue
        acc, peer_acc = runs["gradpart"][-1]["test_acc"], runs[best][-1]["test_acc"]
        out.append(_line(f"{model}: gradpart faster than the best peer at equal or better accuracy",
                         f"{measured}; test acc {acc:.3f} vs {peer_acc:.3f}",
                         speeds["gradpart"] > speeds[best] and acc >= peer_acc))
    return out


def accuracy_and_ratio(convergence, gaps=()):
    """Every model: final accuracy within 0.5 pp of no compression; compression ratio >= 100x.

    ``gaps`` (``records.gap_row`` rows, the longer runs over several seeds) decides the
    models it covers; the convergence runs decide the rest.
    """
    out, decided = [], {g["model"] for g in gaps}
    for g in gaps:
        out.append(_line(f"{g['model']}: gradpart final accuracy within 0.5 pp of none",
                         f"{g['gap_pp']:+.2f} pp, mean of {g['seeds']} seeds after {g['epochs']} epochs "
                         f"(range {g['gap_min']:+.1f} to {g['gap_max']:+.1f})", g["gap_pp"] >= -0.5))
        out.append(_line(f"{g['model']}: gradpart compression ratio >= 100x",
                         f"{g['ratio']:.0f}x, mean of {g['seeds']} seeds after {g['epochs']} epochs",
                         g["ratio"] >= 100))
    for model, runs in convergence.items():
        if model in decided or "gradpart" not in runs or br.REFERENCE not in runs:
            continue
        row = br.summary_row("gradpart", runs["gradpart"], runs[br.REFERENCE])
        out.append(_line(f"{model}: gradpart final accuracy within 0.5 pp of none",
                         f"{row['gap_pp']:+.1f} pp after {row['epochs']} epochs", row["gap_pp"] >= -0.5))
        out.append(_line(f"{model}: gradpart compression ratio >= 100x",
                         f"{row['ratio']:.0f}x (link counters: {row['link_ratio']:.1f}x)",
                         row["ratio"] >= 100))
    return out


def compute_bound(groups):
    """Compute-bound model on an unshaped link: GradPart at most 5 % slower than no compression;
    a model of ``MANY_TENSORS`` on an unshaped link, bound or not: at most 10 %."""
    out = []
    for (model, label, ranks), by in groups.items():
        if label not in UNSHAPED or ranks != 2 or not {"compute-only", "none", "gradpart"} <= set(by):
            continue
        none = by["none"]["samples_per_s"]
        many = model in MANY_TENSORS
        if not many and none < 0.7 * by["compute-only"]["samples_per_s"]:
            continue
        slower = 1 - by["gradpart"]["samples_per_s"] / none
        limit, kind = (10, "100+ tensors") if many else (5, "compute-bound")
        out.append(_line(f"{model}, {label} ({kind}): gradpart <= {limit} % slower than none",
                         f"{100 * slower:+.1f} % slower", slower <= limit / 100))
    return out


def check(throughput_rows, convergence, gaps=()):
    """Every target line that the available results can decide."""
    groups = br.group_throughput(throughput_rows)
    return (mlp_bound(groups) + best_peer(groups, convergence) + accuracy_and_ratio(convergence, gaps)
            + compute_bound(groups))
