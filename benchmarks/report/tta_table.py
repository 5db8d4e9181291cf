"""Time to accuracy over the matrix: per (model, link), each method's medians over seeds.

Reads what ``python -m benchmarks.tta`` wrote (``benchmarks/tta_plan.py``). Per run, against
no compression's run of the same model, link and seed: the training clock after the first step
(``train_s - first_step_s``) and the steps at the first evaluation at or above 95 % and 99 % of
no compression's final accuracy (``harness.progress``); the final accuracy (where the run
stopped: at the 99 % target or a limit; no compression at its budget); the compression ratio
(the compressor's own accounting); the bytes on rank 0's node link, both directions, until the
evaluation that reached 99 % (the whole run where none did); and the first step (tracing, XLA
compiling) on its own. Per method: the median over seeds, with the range; a target not reached
counts as infinitely late, so the median reads "n.r." once half the seeds missed it. The best
tuned Top-k of a (model, link) is the Top-k run (the grid and ``topk``) with the least median
time to 99 %, then to 95 %.
"""
import math
import statistics

from benchmarks import tta_plan as tp
from harness.progress import SHARES, final_record, slowest_step, targets, time_to_accuracy

LOW, HIGH = SHARES
COLUMNS = [("to 95 %: s", "s95", ".1f"), ("steps", "steps95", ".0f"), ("to 99 %: s", "s99", ".1f"),
           ("steps", "steps99", ".0f"), ("final acc", "final_acc", ".3f"), ("ratio", "ratio", ".0f"),
           ("link MB to 99 %", "link_MB", ".1f"), ("first step s", "first_step_s", ".1f"),
           ("slowest step", "slowest", ".1f")]


def load(folder):
    """``{(model, link): {method: {"compressor": name, "seeds": {seed: records}}}}`` of the done runs
    listed in ``folder/index.jsonl``, models and links in the matrix's order."""
    cells = {}
    for (model, link, method, seed), entry in tp.read_index(folder).items():
        path = folder / entry["file"]
        if entry["status"] == "done" and path.exists():
            run = cells.setdefault((model, link), {}).setdefault(method, {"compressor": entry["compressor"],
                                                                          "seeds": {}})
            run["seeds"][seed] = tp.read_records(path)
            steps = tp.steps_path(path)
            run.setdefault("slowest", {})[seed] = slowest_step(tp.read_records(steps)) if steps.exists() else None
    order = {name: i for i, name in enumerate(tp.MODELS + tp.LINKS)}
    return dict(sorted(cells.items(), key=lambda kv: tuple(order.get(k, len(order)) for k in kv[0])))


def seed_figures(records, reference, slowest=None):
    """One run's figures against no compression's run of its seed (not reached: inf);
    ``slowest``: its slowest step over its median step, when every step was timed."""
    goals = targets(reference)
    last = records[-1]
    out = {"slowest": slowest, "target95": goals[LOW], "target99": goals[HIGH], "final_acc": last["test_acc"],
           "ratio": (last.get("compression") or {}).get("compression_ratio"),
           "first_step_s": records[0]["first_step_s"], "end_step": last["step"], "stopped": last.get("stopped")}
    for share, tag in ((LOW, "95"), (HIGH, "99")):
        reached = time_to_accuracy(records, goals[share])
        out["s" + tag] = reached.clock_s if reached else math.inf
        out["steps" + tag] = reached.step if reached else math.inf
    at = next((r for r in records if r["step"] == out["steps99"]), last)
    out["link_MB"] = (at["link_tx_bytes"] + at["link_rx_bytes"]) / 1e6
    return out


def spread(values):
    """(median, min, max) of the values that are not None; None when there are none."""
    values = sorted(v for v in values if v is not None)
    return (statistics.median(values), values[0], values[-1]) if values else None


def method_row(name, run, reference):
    """A method's medians and ranges over the seeds it shares with no compression's runs."""
    seeds = sorted(set(run["seeds"]) & set(reference["seeds"]))
    figures = [seed_figures(run["seeds"][s], reference["seeds"][s], run.get("slowest", {}).get(s)) for s in seeds]
    row = {"method": name, "compressor": run["compressor"], "seeds": len(seeds),
           "reached99": sum(f["s99"] < math.inf for f in figures), "per_seed": dict(zip(seeds, figures))}
    row.update({key: spread(f[key] for f in figures) for key in [k for _, k, _ in COLUMNS] + ["end_step"]})
    return row


def rows(cell):
    """One (model, link)'s rows: no compression, the best tuned Top-k, then every method by median
    time to 99 % and 95 %."""
    if tp.REFERENCE not in cell:
        return []
    by_name = {name: method_row(name, run, cell[tp.REFERENCE]) for name, run in cell.items()}
    by_name = {name: row for name, row in by_name.items() if row["seeds"]}

    def pace(row):
        return row["s99"][0], row["s95"][0], row["steps99"][0], row["method"]

    ordered = sorted((r for n, r in by_name.items() if n != tp.REFERENCE), key=pace)
    topk = [r for r in ordered if r["compressor"] == "topk"]
    best = [{**topk[0], "method": f"best Top-k: {topk[0]['method']}", "best": True}] if topk else []
    return [by_name[tp.REFERENCE], *best, *ordered]


def fmt(value, spec, unit=""):
    return "n.r." if value == math.inf else format(value, spec) + unit


def cell_text(stat, spec, unit=""):
    """``"median (min–max)"``, or the median alone when every seed agrees; a dash for no values."""
    if stat is None:
        return "–"
    median, lo, hi = (fmt(v, spec, unit) for v in stat)
    return median if lo == hi else f"{median} ({lo}–{hi})"


def speedup(row, none):
    mine, theirs = row["s99"][0], none["s99"][0]
    return "–" if mine == math.inf or theirs == math.inf or not mine else f"{theirs / mine:.1f}x"


def markdown(cell_rows):
    """The table of one (model, link)."""
    none = cell_rows[0]
    head = ["method", *(h for h, _, _ in COLUMNS[:4]), "99 % reached", "vs none (99 %)",
            *(h for h, _, _ in COLUMNS[4:])]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in cell_rows:
        cells = [cell_text(r[key], spec, "x" if key == "ratio" else "") for _, key, spec in COLUMNS]
        name = f"**{r['method']}**" if r.get("best") else r["method"]
        lines.append("| " + " | ".join([name, *cells[:4], f"{r['reached99']}/{r['seeds']}", speedup(r, none),
                                        *cells[4:]]) + " |")
    return "\n".join(lines)


def caption(model, link, cell_rows):
    """The line above a (model, link)'s table: seeds, no compression's budget and final accuracy."""
    none = cell_rows[0]
    return (f"**{model}, {link}**: {none['seeds']} seed(s); no compression trained "
            f"{cell_text(none['end_step'], '.0f')} steps to a final accuracy of {cell_text(none['final_acc'], '.3f')}; "
            "the targets are 95 % and 99 % of it, seed by seed.")


def median_runs(cell):
    """``{method: records}``: each method's run of the median seed by time to 99 %, then 95 %."""
    out = {}
    for r in rows(cell):
        if r.get("best"):
            continue
        seeds = sorted(r["per_seed"], key=lambda s: (r["per_seed"][s]["s99"], r["per_seed"][s]["s95"], s))
        out[r["method"]] = cell[r["method"]]["seeds"][seeds[(len(seeds) - 1) // 2]]
    return out


def median_targets(cell):
    """``{share: median over seeds of share x no compression's final accuracy}``."""
    finals = [final_record(records)["test_acc"] for records in cell[tp.REFERENCE]["seeds"].values()]
    return {share: share * statistics.median(finals) for share in SHARES}


def csv_rows(cells):
    """Every run's own figures, one row per (model, link, method, seed); not reached: empty."""
    out = []
    for (model, link), cell in cells.items():
        for r in rows(cell):
            if r.get("best"):
                continue
            for seed, f in r["per_seed"].items():
                out.append({"model": model, "link": link, "method": r["method"], "compressor": r["compressor"],
                            "seed": seed, **{k: None if v == math.inf else v for k, v in f.items()}})
    return out


def headline(cells):
    """Per (model, link): no compression's median time to 99 %, and the fastest default peer, the
    best tuned Top-k and GradPart with their speed-up over it."""
    lines = ["| model | link | seeds | none: to 99 % | fastest peer | best tuned Top-k | gradpart |",
             "|---|---|---|---|---|---|---|"]
    for (model, link), cell in cells.items():
        table = rows(cell)
        if not table:
            continue
        none = table[0]
        peer = next((r for r in table[1:] if r["method"] == r["compressor"] != "gradpart"), None)
        best = next((r for r in table if r.get("best")), None)
        gradpart = next((r for r in table if r["method"] == "gradpart"), None)
        lines.append(f"| {model} | {link} | {none['seeds']} | {seconds(none)} | {against(peer, none)} | "
                     f"{against(best, none)} | **{against(gradpart, none, named=False)}** |")
    return "\n".join(lines + ["", "Median over seeds of the training seconds (evaluations and the first step "
                               "excluded) to 99 % of no compression's final accuracy, same seed, with the speed-up "
                               "over no compression; n.r.: not reached within the run's limits. Peers run their "
                               "defaults; the best tuned Top-k is the fastest of the Top-k grid (docs/results.md, "
                               "\"Time to accuracy\")."])


def seconds(row):
    return fmt(row["s99"][0], ".1f") + ("" if row["s99"][0] == math.inf else " s")


def against(row, none, named=True):
    """``"NAME 12.3 s (3.1x)"``: a row's median time to 99 % and its speed-up over ``none``."""
    if row is None:
        return "–"
    label = row["method"].removeprefix("best Top-k: ") + " " if named else ""
    return f"{label}{seconds(row)} ({speedup(row, none)})"


def picks(cells):
    """Which method to pick on which link: per link, every method's time to 99 % over the fastest
    method's of each model, as a geometric mean over the link's models (not reached: never)."""
    by_link = {}
    for (model, link), cell in cells.items():
        table = [r for r in rows(cell) if not r.get("best")]
        if table:
            by_link.setdefault(link, {})[model] = {r["method"]: r["s99"][0] for r in table}
    lines = ["| link | models | first | then | gradpart |", "|---|---|---|---|---|"]
    for link, models in by_link.items():
        shared = set.intersection(*(set(times) for times in models.values()))
        fastest = {model: min(times.values()) for model, times in models.items()}
        score = {m: _geomean([models[model][m] / fastest[model] for model in models]) for m in shared}
        ranked = sorted(score, key=lambda m: (score[m], m))
        text = lambda m: f"{m} {fmt(score[m], '.2f', 'x')}"
        place = ranked.index("gradpart") + 1 if "gradpart" in score else None
        mine = f"{text('gradpart')}, {place} of {len(ranked)}" if place else "–"
        lines.append(f"| {link} | {', '.join(models)} | {text(ranked[0])} | "
                     f"{', '.join(text(m) for m in ranked[1:4])} | {mine} |")
    return "\n".join(lines + ["", "Each method's median time to 99 % over the fastest method's on the same "
                               "model and link, as a geometric mean over the link's models (1.00x: first on every "
                               "model); methods run on every model of the link only; n.r.: not reached."])


def _geomean(values):
    return math.inf if math.inf in values else math.exp(statistics.fmean(math.log(v) for v in values))
