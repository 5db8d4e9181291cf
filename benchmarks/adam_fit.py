"""Adam under Keras ``fit`` on the edge cluster: GradPart at its defaults against no compression.

    python -m benchmarks.adam_fit --links 100mbit 20mbit --seeds 0 1 2
    python -m benchmarks.adam_fit --optimizer sgd --momentum 0.9 --lr 0.01   # SGD with momentum instead

Each (link, seed) is one launch of ``tests/parallel/keras_fit_client.py`` (a user's Keras script:
a small CNN with Dropout, Adam at a learning rate scaled by the ranks, Horovod's callbacks, 6
epochs of mnist5k) on the two-node edge cluster shaped to the link, under the cluster lock; it
trains every ``--methods`` entry in turn from the same seed. Its ``RESULT`` lines land in
``--out`` with the link; pairs already there are skipped, so a stopped driver resumes. The table
beside it gives each method's test accuracy per seed and its mean difference from no
compression, plus or minus half its range.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import tta_plan as tp
from benchmarks.cluster import HOSTS, Cluster

CLIENT = tp.ROOT / "tests" / "parallel" / "keras_fit_client.py"


def launch(link, seed, methods, log, optimizer):
    """One launch at ``link`` (the cluster already shaped) with the client's ``optimizer`` arguments;
    returns its rows, or exits with the log's tail."""
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    with tempfile.TemporaryDirectory() as work, open(log, "w") as out:
        cmd = [sys.executable, str(tp.ROOT / "scripts" / "launch.py"), "-np", "2", *HOSTS["edge"], "--gloo",
               "--disable-cache", sys.executable, str(CLIENT), "--compression", *methods, "--seed", str(seed),
               "--workdir", work, *optimizer]
        code = subprocess.run(cmd, cwd=CLIENT.parent, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    text = Path(log).read_text()
    if code != 0:
        sys.exit(f"adam_fit: the launch at {link}, seed {seed} failed (exit {code}); its log {log} ends:\n"
                 + "\n".join(text.splitlines()[-15:]))
    return [{**json.loads(line.split("RESULT ", 1)[1]), "link": link}
            for line in text.splitlines() if "RESULT " in line]


def table(rows):
    """Markdown: per link and method, the seeds' test accuracy and the mean difference from none."""
    acc = collections.defaultdict(dict)  # (link, method) -> {seed: accuracy}
    for r in rows:
        acc[r["link"], r["compression"]][r["seed"]] = r["test_accuracy"]
    seeds = sorted({r["seed"] for r in rows})
    lines = [f"| link | method | {' | '.join(f'seed {s}' for s in seeds)} | difference from none, points |",
             "|---|---|" + "---|" * len(seeds) + "---|"]
    for (link, method), by_seed in sorted(acc.items()):
        none = acc.get((link, "none"), {})
        diffs = [100 * (a - none[s]) for s, a in by_seed.items() if s in none]
        gap = (f"{sum(diffs) / len(diffs):+.1f} ± {(max(diffs) - min(diffs)) / 2:.1f}"
               if method != "none" and diffs else "")
        cells = " | ".join(f"{by_seed[s]:.3f}" if s in by_seed else "-" for s in seeds)
        lines.append(f"| {link} | {method} | {cells} | {gap} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--links", nargs="+", default=["100mbit", "20mbit"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--methods", nargs="+", default=["none", "gradpart"])
    p.add_argument("--optimizer", choices=("adam", "sgd"), default="adam")
    p.add_argument("--momentum", type=float, default=0.0, help="SGD's")
    p.add_argument("--lr", type=float, help="single-rank learning rate (the client's default: 0.001)")
    p.add_argument("--out", help="JSONL rows (default results/adam-fit/rows.jsonl; with SGD, "
                                 "sgd-momentumM.jsonl beside it)")
    args = p.parse_args(argv)
    folder = tp.ROOT / "results" / "adam-fit"
    out = Path(args.out or (folder / "rows.jsonl" if args.optimizer == "adam" else
                            folder / f"sgd-momentum{args.momentum:g}.jsonl"))
    optimizer = ["--optimizer", args.optimizer, "--momentum", str(args.momentum),
                 *(["--lr", str(args.lr)] if args.lr else [])]
    out.parent.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    done = {(r["link"], r["seed"]) for r in rows}
    cluster = Cluster(local=False)
    try:
        for link in args.links:
            for seed in args.seeds:
                if (link, seed) in done:
                    continue
                with cluster.hold(link):
                    new = launch(link, seed, args.methods, out.with_name(f"{out.stem}-{link}-seed{seed}.log"),
                                 optimizer)
                with open(out, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in new)
                rows += new
                print(f"adam_fit: {link} seed {seed}: " + ", ".join(
                    f"{r['compression']} {r['test_accuracy']:.3f}" for r in new), flush=True)
    finally:
        cluster.close()
    out.with_suffix(".md").write_text(table(rows))
    print(table(rows))


if __name__ == "__main__":
    main()
