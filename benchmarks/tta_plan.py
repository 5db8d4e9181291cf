"""The time-to-accuracy matrix: its runs, their order and stop rules, and where results live.

A run is one launch of ``scripts/train.py``: a model on mnist5k, a link rate, a method and a
seed, 2 ranks, batch 32 per rank, evaluated every quarter epoch. Per (model, link, seed) no
compression (``none``) runs first, for its step budget ``BUDGET_STEPS``; its final accuracy
gives the targets, 95 % and 99 % of it (``harness.progress``). Every other method then
stops at whichever comes first: the first evaluation at or above the 99 % target
(``--stop-at-acc``), ``STEP_FACTOR`` times the budget in steps (``--max-steps``: sparse
methods may need more steps than no compression), or ``TIME_FACTOR`` times no compression's
training clock after its first step, same seed and link, but at least ``TIME_FLOOR_S``
(``--max-train-s``: a method still short of the target by then is more than that many times
slower than no compression, and a dense-speed method on a slow link must not spend the
matrix's time proving it). The budget is the same on every link, so a seed's targets are the
same in every link's table.

Methods: every compressor registered in ``hvd_gradpart.COMPRESSORS`` with its defaults, plus a
Top-k grid (``GRID``) as the best tuned fixed density; the grid point at Top-k's default ratio
is the registered ``topk`` run itself. ``NAME=COMPRESSOR[,KEY=VALUE...]`` adds a configured
method, as ``scripts/demo.sh`` takes it.

Results: ``<results>/<model>/<link>/<method>-seed<S>.jsonl`` (train.py's records) and
``<results>/index.jsonl``, one line per finished launch, the last line of a run counting; a run
is done when that line says ``done`` and its file exists.
"""
import argparse
import inspect
import json
import math
import re
from pathlib import Path
from typing import NamedTuple

from harness import methods
from harness.progress import final_record, targets
from hvd_gradpart import COMPRESSORS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "tta"
MODELS = ("mlp", "lenet5", "resnet20", "mobilenetv2")
LINKS = ("10gbit", "100mbit", "20mbit", "10mbit")  # 10gbit: unshaped in practice
SEEDS = (0, 1, 2)
REFERENCE = "none"
GRID = (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)  # Top-k ratios: the best tuned fixed density
# No compression's steps per (model, link): mnist5k's 4,000 training digits over 2 ranks at
# batch 32 make 62 steps an epoch; 3 epochs of the MLP (7.5 MB of gradient, 3.5 s a dense step
# at 20 Mbit/s), 5 of the smaller LeNet-5, ResNet-20 and MobileNetV2.
BUDGET_STEPS = {"mlp": 186, "lenet5": 310, "resnet20": 310, "mobilenetv2": 310}
STEP_FACTOR = 4       # every other method's step limit: this many times the budget
TIME_FACTOR = 2.0     # ... and its training clock limit: this many times no compression's
TIME_FLOOR_S = 60.0   # ... but never below this (an unshaped link's budget takes seconds)
RATE = re.compile(r"[1-9][0-9]{0,5}(kbit|mbit|gbit)")  # as scripts/edge_cluster.sh takes it
LOCAL = "localhost"   # the link label of runs on this machine, without the cluster


class MatrixError(ValueError):
    """A method, model, link or seed the matrix cannot run."""


class Method(NamedTuple):
    """One column of the matrix: a registered compressor with options."""

    name: str           # the run's name in files and tables, e.g. topk-0.3%
    compressor: str     # a key of hvd_gradpart.COMPRESSORS
    options: tuple = ()  # KEY=VALUE strings for train.py's --compressor-option


class Run(NamedTuple):
    """One launch of train.py."""

    model: str
    link: str
    seed: int
    method: Method
    budget: int  # no compression's steps for this model; the others' limits scale with it

    @property
    def key(self):
        return (self.model, self.link, self.method.name, self.seed)

    def path(self, results):
        return Path(results) / self.model / self.link / f"{self.method.name}-seed{self.seed}.jsonl"

    def reference(self):
        """No compression's run of the same model, link and seed."""
        return self._replace(method=Method(REFERENCE, REFERENCE))


def grid_name(ratio):
    return f"topk-{100 * ratio:g}%"


def grid():
    """The Top-k grid, without the point the registered ``topk`` run covers."""
    default = inspect.signature(COMPRESSORS["topk"].__init__).parameters["ratio"].default
    return [Method(grid_name(r), "topk", (f"ratio={r}",)) for r in GRID if not math.isclose(r, default)]


def default_methods():
    """Every registered compressor with its defaults (no compression first), then the grid."""
    names = sorted(COMPRESSORS, key=lambda n: (n != REFERENCE, n == "gradpart", n))
    return [Method(n, n) for n in names] + grid()


def parse_method(spec):
    """``NAME`` (registered or on the grid) or ``NAME=COMPRESSOR[,KEY=VALUE...]``.

    Raises:
        MatrixError: the name or compressor is not registered in ``hvd_gradpart.COMPRESSORS``.
    """
    if "=" in spec:
        try:
            name, compressor, kwargs = methods.parse(spec)
        except argparse.ArgumentTypeError as e:
            raise MatrixError(f"method {spec!r}: {e}") from None
        if compressor not in COMPRESSORS:
            raise MatrixError(f"method {spec!r}: compressor {compressor!r} is not registered in "
                              f"hvd_gradpart.COMPRESSORS ({', '.join(sorted(COMPRESSORS))})")
        return Method(name, compressor, methods.texts(kwargs))
    known = {m.name: m for m in default_methods()}
    if spec not in known:
        raise MatrixError(f"method {spec!r} is not registered in hvd_gradpart.COMPRESSORS "
                          f"({', '.join(sorted(COMPRESSORS))}) nor on the Top-k grid "
                          f"({', '.join(m.name for m in grid())}); NAME=COMPRESSOR[,KEY=VALUE] configures one")
    return known[spec]


def plan(models, links, seeds, methods, budget=None):
    """The runs in launch order: link by link (one re-shaping each), then model and seed, no
    compression first in each (it sets the others' targets); it is added where not named.
    ``budget`` replaces ``BUDGET_STEPS`` for every model (short trials)."""
    for model in models:
        if model not in BUDGET_STEPS:
            raise MatrixError(f"model {model!r} has no step budget; choose from {', '.join(BUDGET_STEPS)}")
    for link in links:
        if link != LOCAL and not RATE.fullmatch(link):
            raise MatrixError(f"link {link!r}: expected a rate such as 100mbit (kbit, mbit or gbit)")
    if any(seed < 0 for seed in seeds) or (budget is not None and budget < 1):
        raise MatrixError(f"seeds must be >= 0 and the budget >= 1 step, got {list(seeds)} and {budget}")
    others = [m for m in dict.fromkeys(methods) if m.name != REFERENCE]
    return [Run(model, link, seed, method, budget or BUDGET_STEPS[model])
            for link in links for model in models for seed in seeds
            for method in [Method(REFERENCE, REFERENCE), *others]]


def read_index(results):
    """``{run key: its last index line}``."""
    index = Path(results) / "index.jsonl"
    if not index.exists():
        return {}
    entries = (json.loads(line) for line in index.read_text().splitlines() if line.strip())
    return {(e["model"], e["link"], e["method"], e["seed"]): e for e in entries}


def append_index(results, entry):
    with open(Path(results) / "index.jsonl", "a") as f:
        f.write(json.dumps(entry, sort_keys=True) + "\n")


def is_done(run, index, results):
    entry = index.get(run.key)
    return bool(entry) and entry["status"] == "done" and run.path(results).exists()


def read_records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def stop_options(run, reference=None):
    """train.py's stop options for ``run``: the budget for no compression; for any other
    method its limits, from ``reference`` (no compression's records, same model, link and
    seed), which it needs."""
    if run.method.name == REFERENCE:
        return ["--max-steps", str(run.budget)]
    final = final_record(reference)
    clock = final["train_s"] - final["first_step_s"]
    return ["--max-steps", str(STEP_FACTOR * run.budget), "--stop-at-acc", repr(targets(reference)[0.99]),
            "--max-train-s", f"{max(TIME_FACTOR * clock, TIME_FLOOR_S):.1f}"]


def steps_path(results_file):
    """Where a run's time of every step goes (``train.py --steps-jsonl``), beside its records."""
    return Path(results_file).with_suffix(".steps.jsonl")


def train_args(run, stops, jsonl, steps=None):
    """train.py's arguments for ``run``; ``steps``: a file for the time of every step."""
    every = ["--steps-jsonl", str(steps), "--log-every-steps", "1"] if steps else []
    return ["--model", run.model, "--dataset", "mnist5k",
            *methods.train_args(run.method.compressor, run.method.options),
            "--seed", str(run.seed), "--eval-every", "0.25", *stops, "--jsonl", str(jsonl), *every]
