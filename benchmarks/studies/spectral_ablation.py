"""GradPart's spectral key area against coordinates and PowerSGD: time to accuracy on the cluster.

    python -m benchmarks.studies.spectral_ablation [--models mlp lenet5] [--links 20mbit] [--seeds 0 1 2]
    python -m benchmarks.studies.spectral_ablation --local    # steps and bytes, no link
    python -m benchmarks.studies.spectral_ablation --table-only
    python -m benchmarks.studies.spectral_ablation --links 100mbit --methods gp-key gp-both

Runs ``benchmarks.tta`` (the two-node edge cluster, the shaped link, the matrix's stop rules;
resumable) on ``METHODS`` into ``results/studies/spectral_ablation/``, reusing no compression's
runs of the matrix (``results/tta``) where they exist, then writes one time-to-accuracy table per
model and link (``benchmarks.report.tta_table``: medians over seeds, ranges) to
``results/studies/spectral_ablation.md``. The variants: GradPart's coordinates alone (its
default), its spectral key area alone on the steps it is sent (adaptive-rank PowerSGD within
GradPart), key area and outliers, and PowerSGD at ranks 1, 2 and 4. ``--local`` runs both ranks
on this machine, no cluster and no shaping (link label ``localhost``, no compression run too):
the figures are steps and bytes to accuracy, without a link's time, in place of
``benchmarks.simulate``, whose workers call ``compress`` in turn in one graph and so cannot sum
the factors that PowerSGD and the key area allreduce inside it. Runs of other variants made
into the same folder by hand (``python -m benchmarks.tta --results results/studies/spectral_ablation
--methods NAME=...``) join the tables (docs/notes/gradpart.md says which).
"""
import argparse
import json
import shutil
import sys
from pathlib import Path

from benchmarks import tta, tta_plan as tp
from benchmarks.report import tta_table

OUT = Path("results/studies/spectral_ablation")
METHODS = ("gp-coords=gradpart,spectral=false", "gp-key=gradpart,spectral=true,outliers=false",
           "gp-both=gradpart,spectral=true,outliers=true", "powersgd", "powersgd-r2=powersgd,rank=2",
           "powersgd-r4=powersgd,rank=4")
NAMES = [tp.parse_method(m).name for m in METHODS]


def reuse_reference(models, links, seeds, out, matrix=tp.RESULTS):
    """Copies no compression's finished runs of the matrix into ``out`` (the study's targets)."""
    if not (matrix / "index.jsonl").exists():
        return
    have = tp.read_index(out) if (out / "index.jsonl").exists() else {}
    for (model, link, method, seed), entry in tp.read_index(matrix).items():
        if (method != tp.REFERENCE or model not in models or link not in links or seed not in seeds
                or entry["status"] != "done" or (model, link, method, seed) in have):
            continue
        source = matrix / entry["file"]
        (out / entry["file"]).parent.mkdir(parents=True, exist_ok=True)
        for path in source.parent.glob(source.stem + ".*"):
            shutil.copy(path, (out / entry["file"]).parent / path.name)
        tp.append_index(out, entry)


def table(out=OUT):
    """The study's tables, one per model and link, as Markdown."""
    parts = ["# Spectral key area: time to accuracy (`python -m benchmarks.studies.spectral_ablation`)", ""]
    for (model, link), cell in tta_table.load(out).items():
        rows = tta_table.rows(cell)
        if rows:
            parts += [tta_table.caption(model, link, rows), "", tta_table.markdown(rows), ""]
    return "\n".join(parts)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["mlp", "lenet5"])
    p.add_argument("--links", nargs="+", default=["20mbit"])
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--local", action="store_true", help="both ranks on this machine, no link (steps and bytes)")
    p.add_argument("--methods", nargs="+", choices=NAMES, default=NAMES, help="the variants to run (default all)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--table-only", action="store_true", help="render the table from the runs done")
    args = p.parse_args(argv)
    code = 0
    if not args.table_only:
        args.out.mkdir(parents=True, exist_ok=True)
        reuse_reference(args.models, args.links, args.seeds, args.out)
        where = ["--local"] if args.local else ["--links", *args.links]
        code = tta.main(["--models", *args.models, *where, "--seeds", *map(str, args.seeds),
                         "--results", str(args.out), "--methods",
                         *(m for m, name in zip(METHODS, NAMES) if name in args.methods)])
    args.out.with_suffix(".md").write_text(table(args.out))
    print(json.dumps({"table": str(args.out.with_suffix(".md"))}))
    return code


if __name__ == "__main__":
    sys.exit(main())
