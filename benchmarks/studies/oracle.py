"""What predicts the best Top-k density of each cell of the time-to-accuracy matrix.

    python -m benchmarks.studies.oracle            # reads results/tta, prints a Markdown table

Per (model, link), over the Top-k grid's runs (medians over seeds): a line through (density,
step time) gives ``T0`` (a step's time that does not grow with the values) and ``C`` (what 1 %
of density adds), a line through (log density, log steps to 99 %) gives ``e`` (the steps'
elasticity). Steps times step time, ``d ** -e (T0 + C d)``, is least at ``d* = e / (1 - e) * T0 / C``:
the density at which the values cost the share ``e`` of the step, the budget's objective
(``hvd_gradpart.budget.price``). The table sets ``d*`` beside the grid's best density.
"""
import argparse
import inspect
import math
import statistics
from pathlib import Path

import numpy as np

from benchmarks import tta_plan as tp
from benchmarks.report import tta_table
from hvd_gradpart import COMPRESSORS

ELASTICITY = 0.15  # the budget's (``Config.elasticity``)


def density(name):
    """The Top-k ratio the method ``name`` runs at (its option, else Top-k's default)."""
    options = dict(o.split("=") for o in tp.parse_method(name).options)
    default = inspect.signature(COMPRESSORS["topk"].__init__).parameters["ratio"].default
    return float(options.get("ratio", default))


def grid_points(cell):
    """``[(density, median s99, median steps99, median step ms)]`` of the cell's Top-k runs that reached 99 %."""
    points = []
    for name, run in cell.items():
        if run["compressor"] != "topk":
            continue
        row = tta_table.method_row(name, run, cell[tp.REFERENCE])
        reached = [f for f in row["per_seed"].values() if f["s99"] < math.inf]
        if reached:
            step_ms = statistics.median(1e3 * f["s99"] / f["steps99"] for f in reached)
            points.append((density(name), row["s99"][0], row["steps99"][0], step_ms))
    return sorted(points)


def predicted(points):
    """``(T0 ms, C ms per 1 %, e)`` fitted to the grid's points."""
    d = np.array([p[0] for p in points])
    (t0, c), *_ = np.linalg.lstsq(np.vstack([np.ones_like(d), 100 * d]).T, np.array([p[3] for p in points]),
                                  rcond=None)
    e = -np.polyfit(np.log(d), np.log([p[2] for p in points]), 1)[0]
    return float(t0), float(c), float(e)


def table(cells):
    lines = ["| cell | best Top-k (time to 99 %) | T0 | 1 % costs | e | d* (own e) | d* (e = 0.15) |",
             "|---|---|---|---|---|---|---|"]
    for (model, link), cell in cells.items():
        points = grid_points(cell) if tp.REFERENCE in cell else []
        if len(points) < 3:
            continue
        t0, c, e = predicted(points)
        best = min(points, key=lambda p: p[1])
        star = lambda e: f"{e / (1 - e) * t0 / c:.2g} %"  # t0 in ms, c in ms per 1 %: d* in %
        lines.append(f"| {model}, {link} | {100 * best[0]:g} % ({best[1]:.1f} s) | {t0:.0f} ms | {c:.1f} ms | {e:.2f} "
                     f"| {star(e)} | {star(ELASTICITY)} |")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=tp.RESULTS)
    print(table(tta_table.load(p.parse_args().results)))


if __name__ == "__main__":
    main()
