"""GradPart end to end: a small MLP on scikit-learn's digits, trained through
``hvd.DistributedGradientTape(tape, compression=GradPartCompressor)`` (the
class, so its default instance) inside a ``tf.function``.

Checks on every rank: test accuracy, bit-identical weights across ranks, the
measured compression ratio, and each sparsified tensor's last-step density.
``--compression none`` trains the same model densely (to calibrate the bound);
``--compression rule`` trains with ``GradPartCompressor(follow_link=False)``,
the entropy rule at its own operating point, whose ratio must show that the
rule, not the density ceiling, decides. The default follows the link (on
localhost: fast), so its ratio is a result; its controller's state must be
the same on every rank.
"""
import argparse
import math

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

from common import assert_same_on_all_ranks, check, init, ok
from harness import data, models
from hvd_gradpart import GradPartCompressor, metrics

RANK, SIZE = init()
EPOCHS, BATCH, LR = 3, 32, 0.02
# Measured (deterministic on 2 ranks): dense 0.939 test accuracy; GradPart 0.847 at a
# ratio of 188x (rank 0) / 170x (rank 1) over the five sparsified tensors.
MIN_ACCURACY = 0.8
# Following the link, what is sent depends on the times each step measures, so a loaded machine
# changes the run: 0.74-0.87 seen on localhost (the rule alone is deterministic); chance is 0.1.
MIN_ACCURACY_FOLLOWING = 0.7
# The density ceiling alone guarantees about 4 / (0.02 * 6) = 33x (int32 index + fp16 value
# per element against 4 dense bytes): 100x means the entropy rule, not the ceiling, decides.
MIN_RATIO = 100.0

parser = argparse.ArgumentParser()
parser.add_argument("--compression", choices=["gradpart", "rule", "none"], default="gradpart")
args = parser.parse_args()
compression = {"gradpart": GradPartCompressor, "rule": GradPartCompressor(follow_link=False),
               "none": hvd.Compression.none}[args.compression]

digits = data.load_dataset("digits")
x_train, y_train = data.shard(digits.x_train, digits.y_train, RANK, SIZE)
model = models.build_model("mlp", (8, 8, 1), digits.num_classes, seed=0)
opt = tf.keras.optimizers.SGD(LR, momentum=0.9)
LOSS = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
assert_same_on_all_ranks([v.numpy() for v in model.trainable_variables], "initial weights")


@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = LOSS(y, model(x, training=True))
    tape = hvd.DistributedGradientTape(tape, compression=compression)
    grads = tape.gradient(loss, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss


steps = 0
for epoch in range(EPOCHS):
    for x, y in data.batches(x_train, y_train, BATCH, seed=1, epoch=epoch):
        step(x, y)
        steps += 1

logits = model(digits.x_test, training=False)
accuracy = float(np.mean(np.argmax(logits.numpy(), 1) == digits.y_test))
weights = [v.numpy() for v in model.trainable_variables]
assert_same_on_all_ranks(weights, "trained weights")
print(f"RESULT rank={RANK} compression={args.compression} steps={steps} accuracy={accuracy:.4f}", flush=True)
least = MIN_ACCURACY_FOLLOWING if args.compression == "gradpart" else MIN_ACCURACY
check(accuracy > least, f"test accuracy {accuracy:.4f} <= {least}")

if args.compression != "none":
    compressor = metrics.resolve(compression)
    summary = metrics.summary(compressor)
    per_tensor = metrics.snapshot(compressor)
    sizes = sorted(int(w.size) for w in weights if w.size >= compressor.min_elements)
    check(sorted(int(m["elements"]) for m in per_tensor.values()) == sizes,
          f"sparsified tensors {per_tensor.keys()} are not the {sizes}-element ones")
    for key, m in sorted(per_tensor.items()):
        n, k = int(m["elements"]), int(m["sent_elements"])
        print(f"TENSOR rank={RANK} {key} n={n} sent={k} density={k / n:.5f} family={int(m['family'])} "
              f"beta={m['beta']:.3f} key_size={int(m['key_size'])} tau_key={m['tau_key']:.3g} "
              f"tau_sparse={m['tau_sparse']:.3g}", flush=True)
        check(m["steps"] == steps, f"{key}: compressed {m['steps']} times in {steps} steps")
        # The guards send ceil(1e-4 n) .. floor(2e-2 n) elements: density within [1e-4, 2e-2];
        # a step that follows the link to a dense exchange sends every element.
        check(1e-4 <= k / n <= 2e-2 or (args.compression == "gradpart" and k == n),
              f"{key}: last density {k / n} outside [1e-4, 2e-2]")
        # The key area is the smaller one, so its position costs less: tau_key < tau_sparse, or
        # both 0 while the link's price buys more than either area's position cost.
        check(math.isfinite(m["alpha"]) and (m["tau_key"] < m["tau_sparse"] or m["tau_sparse"] == 0),
              f"{key}: diagnostics {m}")
    ratio = summary["compression_ratio"]
    print(f"RESULT rank={RANK} ratio={ratio:.1f} last_density={summary['last_density']:.5f}", flush=True)
    if args.compression == "rule":
        check(ratio > MIN_RATIO, f"compression ratio {ratio:.1f} <= {MIN_RATIO}")
    else:
        link = summary["link"]
        print(f"LINK rank={RANK} {link}", flush=True)
        # a step's figures come back with the next step and are folded at the one after it
        check(link["steps"] == steps - 2 and math.isfinite(link["price_nats"]), f"link state {link}")
        shared = [v for k, v in sorted(link.items()) if k not in ("density", "bytes_per_element")]  # rank-local
        assert_same_on_all_ranks([np.array(shared, np.float64)], "link state")

ok(f"gradpart training checks passed on {SIZE} ranks")
