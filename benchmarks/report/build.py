"""Tables, CSV/JSON summaries and plots from the benchmark result files; fills docs/results.md.

    python -m benchmarks.report        # = --results results --docs docs/results.md README.md
    python -m benchmarks.report --table results/throughput.jsonl       # one table, printed
    python -m benchmarks.report --wire-table results/wire.jsonl
    python -m benchmarks.report --diagnose results/diagnose    # benchmarks.simulate --diagnose's tables

Reads what exists of ``tta/`` (the time-to-accuracy matrix), ``throughput.jsonl``,
``convergence/``, ``ablation/``, ``gap/``, ``scaling.jsonl`` and ``linkprobe-<rate>.json`` under
``--results``; writes ``*.csv``, ``targets.json``, ``scaling.json`` and ``plots/*.png`` there, and
replaces each block of the ``--docs`` files between ``<!-- generated:NAME -->`` and
``<!-- /generated:NAME -->`` with the current figures.
"""
import argparse
import json
import re
from pathlib import Path

from benchmarks import records as br
from benchmarks import scaling
from benchmarks.report import diagnose, layout, plots, table, targets, tta_table, wire_table

ROOT = Path(__file__).resolve().parents[2]
README_LINKS = ("100mbit", "20mbit")  # the links of the README's tables (every link: docs/results.md)

RUN_COLUMNS = [("run", "run", ""), ("epochs", "epochs", "d"), ("test acc", "test_acc", ".4f"),
               ("gap vs none (pp)", "gap_pp", "+.1f"), ("test loss", "test_loss", ".3f"),
               ("ratio (compressor)", "ratio", ".0f"), ("ratio (link, vs none)", "link_ratio", ".1f"),
               ("last density", "density", ".2e"), ("link MB", "link_MB", ".1f"),
               ("samples/s", "samples_per_s", ".0f"), ("wall s", "wall_s", ".0f"),
               ("s to 95 % of none's acc", "s_to_target", ".0f")]
ABLATION_COLUMNS = [("gap vs gradpart (pp)", k, f) if k == "gap_pp" else (h, k, f)
                    for h, k, f in RUN_COLUMNS if k not in ("link_ratio", "s_to_target")]
GAP_COLUMNS = [("model", "model", ""), ("seeds", "seeds", "d"), ("epochs", "epochs", "d"),
               ("none: test acc", "none_acc", ".4f"), ("gradpart: test acc", "test_acc", ".4f"),
               ("gap (pp), mean", "gap_pp", "+.2f"), ("sd", "gap_sd", ".2f"), ("min", "gap_min", "+.1f"),
               ("max", "gap_max", "+.1f"), ("gradpart ratio", "ratio", ".0f"),
               ("link ratio (vs none)", "link_ratio", ".1f")]
SCALING_NODES = (2, 4, 8, 16, 32, 64)
SCALING_RATES = ("20mbit", "100mbit", "1gbit", "10gbit")


def fill(text, name, content):
    """``text`` with the generated block ``name`` replaced by ``content``."""
    pattern = re.compile(rf"(<!-- generated:{name} -->\n).*?(<!-- /generated:{name} -->)", re.S)
    return pattern.sub(lambda m: m.group(1) + content.strip() + "\n" + m.group(2), text)


def tta_section(results, cells):
    """Per (model, link) the time-to-accuracy table, per model one plot; every run's figures in tta.csv."""
    br.write_csv(tta_table.csv_rows(cells), results / "tta.csv")
    parts = []
    for model in dict.fromkeys(m for m, _ in cells):
        links = {link: cell for (m, link), cell in cells.items() if m == model and tta_table.rows(cell)}
        parts.append(cell_tables({(model, link): cell for link, cell in links.items()}))
        if links:
            png = f"tta-{model}.png"
            plots.time_to_accuracy({link: (tta_table.median_runs(cell), tta_table.median_targets(cell))
                                    for link, cell in links.items()}, results / "plots" / png,
                                   f"{model}: test accuracy by training seconds (median seed)")
            parts += [f"![{model} time to accuracy](../results/plots/{png})", ""]
    return "\n".join(parts)


def cell_tables(cells):
    """Per (model, link) its caption and time-to-accuracy table, no plot (a side-by-side study)."""
    parts = []
    for (model, link), cell in cells.items():
        cell_rows = tta_table.rows(cell)
        if cell_rows:
            parts += [tta_table.caption(model, link, cell_rows), "", tta_table.markdown(cell_rows), ""]
    return "\n".join(parts)


def throughput_section(results, rows):
    """Table, CSV and bar plot of the throughput rows."""
    (results / "throughput.md").write_text(table.table(rows) + "\n")
    br.write_csv([{k: v for k, v in r.items() if k not in ("compression", "windows_s")} for r in rows],
                 results / "throughput.csv")
    plots.throughput(rows, results / "plots" / "throughput.png",
                     "samples/s per method, compute-only bound dashed")
    return table.table(rows) + "\n\n![throughput](../results/plots/throughput.png)"


def runs_section(results, kind, runs, reference):
    """Tables and plots of convergence or ablation runs, one model at a time."""
    parts, all_rows = [], []
    for model, by_name in runs.items():
        ref = by_name.get(reference)
        order = sorted(by_name, key=lambda n: (n != reference, n))
        rows = [{**br.summary_row(n, by_name[n], ref), "reference": reference} for n in order]
        all_rows += rows
        last = rows[0]
        head = (f"**{model}** on {last['dataset']}, {last['ranks']} ranks, "
                f"{last['epochs']} epochs, seed 0")
        columns = RUN_COLUMNS if reference == br.REFERENCE else ABLATION_COLUMNS
        parts += [head, "", br.markdown(rows, columns), ""]
        stem = results / "plots" / f"{kind}-{model}"
        if kind == "convergence":
            plots.convergence(by_name, f"{stem}.png", f"{model}: test accuracy and loss, 2 ranks")
            plots.ratios(by_name, f"{stem}-ratio.png", f"{model}: compression ratio over training")
            parts.append(f"![{model} convergence](../results/plots/{kind}-{model}.png)\n"
                         f"![{model} ratio](../results/plots/{kind}-{model}-ratio.png)")
            tensors = results / kind / model / "gradpart.tensors.jsonl"
            if tensors.exists() and tensors.stat().st_size:
                plots.density(br.read_jsonl(tensors), f"{stem}-density.png",
                              f"{model}: GradPart's density per layer")
                parts.append(f"![{model} density](../results/plots/{kind}-{model}-density.png)")
        else:
            plots.ablation(rows, f"{stem}.png", f"{model}: GradPart with one stage switched off")
            parts.append(f"![{model} ablation](../results/plots/{kind}-{model}.png)")
        parts.append("")
    br.write_csv(all_rows, results / f"{kind}.csv")
    return "\n".join(parts)


def gap_section(results, seeds):
    """The seed-averaged final accuracy gap per model, and every seed's own row in gap.csv."""
    rows = [r for model, by_seed in seeds.items() if (r := br.gap_row(model, by_seed))]
    per_seed = [{**br.summary_row(name, runs[name], runs.get(br.REFERENCE)), "seed": seed}
                for by_seed in seeds.values() for seed, runs in by_seed.items() for name in runs]
    br.write_csv(per_seed, results / "gap.csv")
    return rows, br.markdown(rows, GAP_COLUMNS)


def bandwidth(results, label):
    """Measured link bandwidth (bytes/s) at ``label``, else the nominal rate."""
    probe = results / f"linkprobe-{label}.json"
    if probe.exists():
        return json.loads(probe.read_text())["bandwidth_MBps"]["1"] * 1e6
    return scaling.rate_bytes(label)


def scaling_section(results, rows, throughput_rows):
    """Calibrates the model on the 2-node MLP throughput launch at 100 Mbit/s (else on the
    2-node rows of scaling.jsonl) and checks it against every launch of scaling.jsonl."""
    groups = br.group_throughput(rows)
    source = br.group_throughput(throughput_rows).get(("mlp", "100mbit", 2))
    if source and "gradpart" in source:
        (model, label), group, where = ("mlp", "100mbit"), source, "the throughput launch"
    else:
        key = next((k for k in groups if k[2] == 2), None)
        if key is None:
            return "No 2-node rows to calibrate on."
        (model, label, _), group, where = key, groups[key], "the 2-node launch of scaling.jsonl"
    c = scaling.calibrate(group, bandwidth(results, label))
    measured, checks = {}, []
    for (m, lab, n), g in groups.items():
        for method, kind in (("none", "dense"), ("gradpart", "sparse")):
            if method in g:
                measured[(kind, n)] = g[method]["step_s"]
                predicted = scaling.step_time(c, kind, n, c.bandwidth, g["compute-only"]["step_s"])
                checks.append({"nodes": n, "method": method, "measured_step_s": g[method]["step_s"],
                               "predicted_step_s": predicted,
                               "compute_only_step_s": g["compute-only"]["step_s"]})
    predictions = scaling.prediction_rows(c, SCALING_NODES, SCALING_RATES)
    even = {lab: scaling.break_even_nodes(c, scaling.rate_bytes(lab)) for lab in SCALING_RATES}
    even_b = {n: scaling.break_even_bandwidth(c, n) * 8 / 1e6 for n in SCALING_NODES}
    summary = {"constants": c.__dict__, "calibrated_on": f"{where}, {label}", "checks": checks,
               "predictions": predictions, "break_even_nodes": even, "break_even_mbit": even_b}
    (results / "scaling.json").write_text(json.dumps(summary, indent=1) + "\n")
    plots.scaling_curves(c, measured, results / "plots" / "scaling.png",
                         f"{model}: modelled step time, dense allreduce (--) vs sparse allgather (-)")
    lines = [f"Constants ({model}, calibrated on {where} at {label}): compute-only step "
             f"{1e3 * c.t_compute:.1f} ms, dense gradient M = {c.dense_bytes / 1e6:.2f} MB, GradPart "
             f"payload s = {c.sparse_bytes / 1e3:.1f} kB per rank per step, dense small tensors "
             f"m = {c.small_bytes / 1e3:.1f} kB, link {c.bandwidth / 1e6:.1f} MB/s at efficiency "
             f"eta = {c.efficiency:.2f}, sparse fixed cost o_s = {1e3 * c.overhead:.0f} ms at N = 2.", "",
             br.markdown(checks, [("nodes", "nodes", "d"), ("method", "method", ""),
                                  ("compute-only (s)", "compute_only_step_s", ".3f"),
                                  ("measured step (s)", "measured_step_s", ".3f"),
                                  ("model (s)", "predicted_step_s", ".3f")]), "",
             "Modelled samples/s (compute per node as measured at N = 2, one node per machine):", "",
             br.markdown(predictions, [("link", "link", ""), ("nodes", "nodes", "d"),
                                       ("dense allreduce", "dense_sps", ".0f"),
                                       ("gradpart", "sparse_sps", ".0f"),
                                       ("gradpart / dense", "speedup", ".2f"),
                                       ("gradpart of bound", "sparse_of_bound", ".2f")]), "",
             "Dense allreduce catches up with GradPart at N = " + ", ".join(
                 f"{even[lab] or '>4096'} ({lab})" for lab in SCALING_RATES)
             + "; at a given N, dense is faster above " + ", ".join(
                 f"{even_b[n]:.0f} Mbit/s (N = {n})" for n in SCALING_NODES) + ".",
             "", "![scaling](../results/plots/scaling.png)"]
    return "\n".join(lines)


def headline_section(rows, convergence, gaps):
    """Throughput against the bound, none and the fastest peer; accuracy and ratio per model
    (seed means of the gap runs where there are some)."""
    lines = []
    if rows:
        lines += ["| model | link | compute-only bound | none | fastest peer | gradpart |",
                  "|---|---|---|---|---|---|"]
        for (model, label, ranks), by in br.group_throughput(rows).items():
            if not {"compute-only", "none", "gradpart"} <= set(by):
                continue
            bound, gp = by["compute-only"]["samples_per_s"], by["gradpart"]["samples_per_s"]
            none = by["none"]["samples_per_s"]
            peers = sorted((by[p]["samples_per_s"], p) for p in targets.PEERS if p in by)
            peer = f"{peers[-1][1]} {peers[-1][0]:.0f}" if peers else "–"
            lines.append(f"| {model} | {label}, {ranks} ranks | {bound:.0f} | {none:.0f} | {peer} | "
                         f"**{gp:.0f}** "
                         f"({gp / bound:.2f} of bound, {gp / none:.1f}x none) |")
        lines += ["", "samples/s, all methods in one launch per row.", ""]
    if gaps:
        lines += ["| model | epochs | seeds | none: test acc | gradpart: test acc | gap (pp) | gradpart ratio "
                  "| link ratio |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {g['model']} | {g['epochs']} | {g['seeds']} | {g['none_acc']:.3f} | {g['test_acc']:.3f} | "
                  f"{g['gap_pp']:+.2f} | {g['ratio']:.0f}x | {g['link_ratio']:.1f}x |" for g in gaps]
        lines += ["", "Means over seeds; cosine learning rate, 10 Gbit/s link (see docs/results.md); link ratio: "
                  "no compression's bytes on the link over GradPart's (kernel counters, Horovod's own traffic "
                  "included)."]
    elif convergence:
        lines += ["| model | epochs | none: test acc | gradpart: test acc | gap (pp) | gradpart ratio | link ratio |",
                  "|---|---|---|---|---|---|---|"]
        for model, runs in convergence.items():
            if {"none", "gradpart"} <= set(runs):
                r = br.summary_row("gradpart", runs["gradpart"], runs["none"])
                lines.append(f"| {model} | {r['epochs']} | {runs['none'][-1]['test_acc']:.3f} | "
                             f"{r['test_acc']:.3f} | {r['gap_pp']:+.1f} | {r['ratio']:.0f}x | "
                             f"{r['link_ratio']:.1f}x |")
    return "\n".join(lines)


def targets_section(results, rows, convergence, gaps):
    lines = targets.check(rows, convergence, gaps)
    (results / "targets.json").write_text(json.dumps(lines, indent=1) + "\n")
    return br.markdown(lines, [("target", "target", ""), ("measured", "measured", ""),
                               ("status", "status", "")])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=ROOT / "results", type=Path)
    p.add_argument("--docs", type=Path, nargs="*", default=[ROOT / "docs" / "results.md", ROOT / "README.md"],
                   help="Markdown files with generated blocks to fill (none: --docs alone)")
    p.add_argument("--table", type=Path, metavar="FILE", help="print the table of a benchmarks.throughput file, and stop")
    p.add_argument("--wire-table", type=Path, metavar="FILE", help="print the table of a benchmarks.wire file, and stop")
    p.add_argument("--diagnose", type=Path, metavar="DIR", help="print the tables of benchmarks.simulate "
                   "--diagnose's records in DIR (and its --out records), and stop")
    args = p.parse_args(argv)
    for path, render in ((args.table, table.table), (args.wire_table, wire_table.table)):
        if path:
            print(render(br.read_jsonl(path)))
            return
    if args.diagnose:
        print(diagnose.tables(args.diagnose))
        return
    results = args.results
    (results / "plots").mkdir(parents=True, exist_ok=True)
    blocks = {}
    suite = results / "suite.json"
    if suite.exists():
        s = json.loads(suite.read_text())
        blocks["suite"] = (f"Last suite run: `{s['mode']}` mode, finished {s['finished']}, "
                           f"{s['minutes']} minutes (including waits for the cluster lock).")
    tta = tta_table.load(results / "tta")
    if tta:
        blocks["tta"] = tta_section(results, tta)
        shaped = {cell: runs for cell, runs in tta.items() if cell[1] in README_LINKS}
        blocks["tta-headline"] = tta_table.headline(shaped)
        blocks["pick"] = tta_table.picks(shaped)
    keyed = tta_table.load(results / "tta-keyed")
    if keyed:
        blocks["tta-keyed"] = cell_tables(keyed)
    throughput_file = results / "throughput.jsonl"
    rows = br.read_jsonl(throughput_file) if throughput_file.exists() else []
    if rows:
        blocks["throughput"] = throughput_section(results, rows)
    convergence = br.load_runs(results / "convergence")
    if convergence:
        blocks["convergence"] = runs_section(results, "convergence", convergence, br.REFERENCE)
    ablation = br.load_runs(results / "ablation")
    if ablation:
        blocks["ablation"] = runs_section(results, "ablation", ablation, "gradpart")
    gaps = []
    seeds = br.load_seeds(results / "gap")
    if seeds:
        gaps, blocks["gap"] = gap_section(results, seeds)
    if (results / "scaling.jsonl").exists():
        blocks["scaling"] = scaling_section(results, br.read_jsonl(results / "scaling.jsonl"), rows)
    blocks["targets"] = targets_section(results, rows, convergence, gaps)
    blocks["headline"] = headline_section(rows, convergence, gaps)
    blocks["layout"] = layout.tree(ROOT)
    for doc in args.docs:
        text = doc.read_text()
        for name, content in blocks.items():
            if f"<!-- generated:{name} -->" in text:
                text = fill(text, name, content)
        doc.write_text(text)
    for name in blocks:
        print(f"benchmarks.report: {name} done")
