"""GradPart after 10 epochs, with and without its spectral key area, against no compression and PowerSGD.

    python -m benchmarks.studies.spectral_accuracy [--seeds 0 1 2] [--rate 20mbit]
    python -m benchmarks.studies.spectral_accuracy --table-only

Trains the MLP and LeNet-5 for 10 epochs with GradPart's defaults (``gradpart``) and with its key
area (``gp-both``: ``spectral=true``) on the two-node edge cluster at ``--rate``
(``benchmarks/convergence.sh``: mnist5k, 32 per rank, cosine schedule, the set-up of
``results/powersgd/summary.md``) into ``results/studies/spectral_accuracy/seed<k>/<model>/``.
No compression's and PowerSGD's 10-epoch runs are ``results/powersgd``'s (their training does not
depend on the link: the same weights on any), copied beside them. The table
(``results/studies/spectral_accuracy.md``): final accuracy, mean gap to no compression over the
seeds with its range, and the compressor's own compression ratio.
"""
import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import records

OUT = Path("results/studies/spectral_accuracy")
REFERENCES = Path("results/powersgd")
MODELS = ("mlp", "lenet5")
RUNS = ("gradpart=gradpart", "gp-both=gradpart,spectral=true")
COLUMNS = [("model", "model", ""), ("run", "run", ""), ("seeds", "seeds", "d"), ("none", "none_acc", ".4f"),
           ("final accuracy", "test_acc", ".4f"), ("gap (pp)", "gap_pp", "+.2f"), ("min", "gap_min", "+.1f"),
           ("max", "gap_max", "+.1f"), ("ratio", "ratio", ".0f")]


def copy_references(seeds, out=OUT, references=REFERENCES):
    """No compression's and PowerSGD's runs of ``references`` into ``out``'s layout."""
    for seed in seeds:
        for model in MODELS:
            for run in (records.REFERENCE, "powersgd"):
                source = references / f"{model}-{run}-seed{seed}.jsonl"
                if source.exists():
                    (out / f"seed{seed}" / model).mkdir(parents=True, exist_ok=True)
                    shutil.copy(source, out / f"seed{seed}" / model / f"{run}.jsonl")


def train(seeds, rate, out=OUT):
    """GradPart's runs, one ``convergence.sh`` launch per seed and model."""
    env = {**os.environ, "EPOCHS": "10", "RATE": rate, "LR_SCHEDULE": "cosine"}
    for seed in seeds:
        for model in MODELS:
            subprocess.run(["bash", "benchmarks/convergence.sh", str(out / f"seed{seed}"), model, *RUNS],
                           env={**env, "SEED": str(seed)}, check=True)


def table(out=OUT):
    """The gaps to no compression, per model and run, as Markdown."""
    by_model = records.load_seeds(out)
    names = [r.split("=")[0] for r in RUNS] + ["powersgd"]
    rows = [row for model in MODELS if model in by_model
            for name in names if (row := records.gap_row(model, by_model[model], name))]
    return "\n".join(["# GradPart after 10 epochs (`python -m benchmarks.studies.spectral_accuracy`)", "",
                      records.markdown(rows, COLUMNS), ""])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--rate", default="20mbit", help="the link's rate (edge_cluster.sh --rate)")
    p.add_argument("--table-only", action="store_true", help="render the table from the runs done")
    args = p.parse_args(argv)
    if not args.table_only:
        train(args.seeds, args.rate)
    copy_references(args.seeds)
    OUT.with_suffix(".md").write_text(table())
    print(OUT.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
