"""How GradPart's rule spreads a step's values over tensors of different sizes, against a global Top-k.

    python -m benchmarks.studies.allocation resnet20 mobilenetv2     # results/allocation/

One process trains the model on mnist5k without compression (SGD 0.02, momentum 0.9, batch 32,
``--steps`` steps); every step, each sparsified gradient (1,024 elements or more) feeds three
selections that keep their own residuals (error feedback, as a rank would):

- ``per-tensor``: GradPart's entropy rule with a position named among the tensor's own elements
  (``log n_A``), the allocation before the model-wide position cost;
- ``model-wide``: the rule as it ships, a position named among the whole step's elements
  (``log (n_A N / n)``);
- ``global top-k``: the largest accumulated magnitudes over every tensor at once, as many as the
  model-wide rule sent that step.

The rule uses the library's own fit, thresholds and mask (``GradPartCompressor.plan`` and
``mask``, its 2 % ceiling, no link price). Written per model: the density of each size class
(elements per tensor, by decades), averaged over the steps after the first 20, as JSON and a
Markdown table.
"""
import argparse
import json
import math
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import training  # noqa: E402
from harness.data import batches, load_dataset  # noqa: E402
from harness.models import build_model  # noqa: E402
from hvd_gradpart import stats  # noqa: E402
from hvd_gradpart.compressors.gradpart import GradPartCompressor  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "results" / "allocation"
CLASSES = ((0, 4096), (4096, 16384), (16384, 65536), (65536, math.inf))
SETTLE = 20  # steps left out of the means (the fits' predictions settle)


class RuleSelection:
    """GradPart's rule on one gradient stream per tensor, with its residuals and predictions."""

    def __init__(self, rule, sizes, model_wide):
        self.rule, self.model_wide, self.total = rule, model_wide, sum(sizes)
        self.residuals = [np.zeros(n, np.float32) for n in sizes]
        self.fits = [stats.Fit(*(tf.constant(v, tf.float64) for v in (0.0, 1.0, 2.0)), tf.constant(stats.GAUSSIAN))
                     for _ in sizes]
        self.steps = 0.0

    def step(self, grads):
        """Selects from every tensor; returns the values sent per tensor."""
        sent = []
        for i, g in enumerate(grads):
            n = g.size
            acc = self.residuals[i] + g
            sample, valid = stats.fixed_sample(tf.constant(g), self.rule.research.sample_size)
            scope = math.log(self.total / n) if self.model_wide else 0.0
            plan = self.rule.plan(sample, valid, self.fits[i], tf.constant(self.steps, tf.float64),
                                  tf.constant(float(n), tf.float64), tf.constant(scope, tf.float64))
            self.fits[i] = plan[0]
            chosen = np.flatnonzero(self.rule.mask(tf.constant(acc), tf.constant(g), None, plan).numpy())
            ceiling = int(self.rule.density_ceiling * n)
            if chosen.size > ceiling:
                chosen = chosen[np.argpartition(-np.abs(acc[chosen]), ceiling)[:ceiling]]
            acc[chosen] = 0.0
            self.residuals[i] = acc
            sent.append(chosen.size)
        self.steps += 1
        return sent


class GlobalTopK:
    """The ``k`` largest accumulated magnitudes over every tensor at once, with residuals."""

    def __init__(self, sizes):
        self.residuals = [np.zeros(n, np.float32) for n in sizes]

    def step(self, grads, k):
        accs = [r + g for r, g in zip(self.residuals, grads)]
        flat = np.abs(np.concatenate(accs))
        cut = np.partition(flat, flat.size - k)[flat.size - k] if k > 0 else np.inf
        sent = []
        for i, acc in enumerate(accs):
            chosen = np.abs(acc) >= cut
            sent.append(int(chosen.sum()))
            acc[chosen] = 0.0
            self.residuals[i] = acc
        return sent


def study(name, steps, seed=0):
    """Per size class: its tensors and elements, and each selection's mean density."""
    data = load_dataset("mnist5k")
    tf.keras.utils.set_random_seed(seed)
    model = build_model(name, data.x_train.shape[1:], 10, seed=seed)
    optimizer = tf.keras.optimizers.SGD(0.02, momentum=0.9)

    @tf.function
    def train(x, y):
        with tf.GradientTape() as tape:
            loss = training.LOSS(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return [g for g in grads if g.shape.num_elements() >= 1024]

    sizes = [v.shape.num_elements() for v in model.trainable_variables if v.shape.num_elements() >= 1024]
    rule = GradPartCompressor(follow_link=False)
    selections = {"per-tensor": RuleSelection(rule, sizes, False), "model-wide": RuleSelection(rule, sizes, True)}
    top = GlobalTopK(sizes)
    sums = {key: np.zeros(len(sizes)) for key in (*selections, "global top-k")}
    done, epoch = 0, 0
    while done < steps:
        for x, y in batches(data.x_train, data.y_train, 32, seed, epoch):
            grads = [g.numpy().ravel() for g in train(x, y)]
            sent = {key: s.step(grads) for key, s in selections.items()}
            sent["global top-k"] = top.step(grads, sum(sent["model-wide"]))
            if done >= SETTLE:
                for key, counts in sent.items():
                    sums[key] += counts
            done += 1
            if done == steps:
                break
        epoch += 1
    measured = steps - SETTLE
    rows = []
    for lo, hi in CLASSES:
        members = [i for i, n in enumerate(sizes) if lo <= n < hi]
        if not members:
            continue
        elements = sum(sizes[i] for i in members)
        rows.append({"class": f"{lo:,}-{hi:,}" if math.isfinite(hi) else f">= {lo:,}", "tensors": len(members),
                     "elements": elements,
                     **{key: float(sum(s[i] for i in members)) / (elements * measured) for key, s in sums.items()}})
    total = sum(sizes)
    overall = {key: float(s.sum()) / (total * measured) for key, s in sums.items()}
    return {"model": name, "steps": steps, "settle": SETTLE, "elements": total, "classes": rows, "overall": overall}


def table(result):
    keys = ("per-tensor", "model-wide", "global top-k")
    lines = [f"{result['model']}: {result['elements']:,} sparsified elements, density per size class, mean of steps "
             f"{result['settle'] + 1}-{result['steps']} (`python -m benchmarks.studies.allocation`)", "",
             "| elements per tensor | tensors | elements | " + " | ".join(keys) + " |",
             "|---|---|---|" + "---|" * len(keys)]
    for row in result["classes"] + [{"class": "all", "tensors": "", "elements": result["elements"],
                                     **result["overall"]}]:
        lines.append(f"| {row['class']} | {row['tensors']} | {row['elements']:,} | "
                     + " | ".join(f"{100 * row[k]:.3f} %" for k in keys) + " |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", choices=("mlp", "lenet5", "resnet20", "mobilenetv2"))
    p.add_argument("--steps", type=int, default=155, help="training steps (> 20)")
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    if args.steps <= SETTLE:
        p.error(f"--steps must exceed {SETTLE}")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    args.results.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        result = study(name, args.steps)
        (args.results / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.results / f"{name}.md").write_text(table(result))
        print(table(result), flush=True)


if __name__ == "__main__":
    main()
