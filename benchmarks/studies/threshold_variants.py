"""Short-run accuracy of GradPart's threshold variants (the table in docs/algorithm.md).

    python -m benchmarks.studies.threshold_variants MODEL VARIANT [VALUE]

VARIANT: ``dense`` (no compression), ``default``, ``cap`` (position cost capped at
``steps + 1`` nats), ``ramp`` (thresholds ramped up linearly over VALUE steps) or ``scale``
(thresholds times VALUE). One process, mnist5k, batch 64, SGD 0.02 with momentum 0.9, 3 epochs,
seed 0; compress and decompress are applied to every gradient as one rank would.
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

from harness import training  # noqa: E402
from harness.data import batches, load_dataset  # noqa: E402
from harness.models import build_model  # noqa: E402
from hvd_gradpart import GradPartCompressor, entropy, summary  # noqa: E402

VARIANTS = {
    "default": lambda steps, n, value: 1.0,
    "cap": lambda steps, n, value: tf.minimum((steps + 1) / entropy.position_cost(n), 1.0),
    "ramp": lambda steps, n, value: tf.minimum((steps + 1) / value, 1.0),
    "scale": lambda steps, n, value: value,
}


def with_factor(factor, value):
    """GradPart's plan with both thresholds multiplied by ``factor(steps, n, value)``."""
    plan = GradPartCompressor.plan.python_function

    def scaled(self, sample, previous, steps, n):
        fit, key_size, edge, tau_key, tau_sparse = plan(self, sample, previous, steps, n)
        f = tf.cast(factor(steps, n, value), tf.float64)
        return fit, key_size, edge, tau_key * f, tau_sparse * f

    return tf.function(scaled, jit_compile=True, reduce_retracing=True, autograph=False)


def main():
    model_name, variant = sys.argv[1], sys.argv[2]
    value = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    training.limit_threads(1)
    hvd.init()
    if variant != "dense":
        GradPartCompressor.plan = with_factor(VARIANTS[variant], value)
    data = load_dataset("mnist5k")
    tf.keras.utils.set_random_seed(0)
    model = build_model(model_name, data.x_train.shape[1:], 10)
    optimizer = tf.keras.optimizers.SGD(0.02, momentum=0.9)
    compressor = GradPartCompressor()

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = training.LOSS(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        if variant != "dense":
            grads = [compressor.decompress(*compressor.compress(g)) for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for epoch in range(3):
        for xb, yb in batches(data.x_train, data.y_train, 64, 0, epoch):
            step(xb, yb)
        _, accuracy = training.evaluate(model, data.x_test, data.y_test)
        ratio = summary(compressor)["compression_ratio"] if variant != "dense" else 1.0
        print(f"{model_name} {variant} {value:g} epoch {epoch + 1} accuracy {accuracy:.4f} ratio {ratio:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
