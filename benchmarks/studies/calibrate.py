"""Single-process calibration run: a compressor's density, ratio and accuracy per epoch.

    python -m benchmarks.studies.calibrate lenet5 gradpart '{"margin": 0}'

mnist5k, batch 32, SGD 0.02 (momentum 0.9, none for dgc), 4 epochs; compress and decompress are
applied to every gradient as one rank would (hvd.init() in one process).
"""
import sys, json, numpy as np, tensorflow as tf, horovod.tensorflow as hvd
tf.config.threading.set_intra_op_parallelism_threads(2); tf.config.threading.set_inter_op_parallelism_threads(1)
hvd.init()
from harness import training
from harness.data import load_dataset, batches
from harness.models import build_model
from hvd_gradpart import get_compressor
from hvd_gradpart.metrics import snapshot
model_name, comp_name = sys.argv[1], sys.argv[2]
opts = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
epochs = 4
data = load_dataset("mnist5k")
tf.keras.utils.set_random_seed(0)
model = build_model(model_name, data.x_train.shape[1:], 10)
opt = tf.keras.optimizers.SGD(0.02, momentum=0.9 if comp_name!="dgc" else 0)
comp = get_compressor(comp_name, **opts)
@tf.function
def step(x, y):
    with tf.GradientTape() as tape:
        loss = training.LOSS(y, model(x, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    if hasattr(comp, "memory"):
        grads = [comp.decompress(*comp.compress(g)) if not isinstance(g, tf.IndexedSlices) else g for g in grads]
    opt.apply_gradients(zip(grads, model.trainable_variables))
    return loss
for e in range(epochs):
    dens = []
    for xb, yb in batches(data.x_train, data.y_train, 32, 0, e):
        step(xb, yb)
        if hasattr(comp, "memory"):
            s = snapshot(comp); dens.append({k: v["sent_elements"]/v["elements"] for k, v in s.items()})
    tl, ta = training.evaluate(model, data.x_test, data.y_test)
    line = f"{model_name} {comp_name} {opts} epoch {e+1} acc {ta:.4f}"
    if dens:
        mean = {k.split('/')[-1]: round(float(np.mean([d[k] for d in dens])), 5) for k in dens[0]}
        s = snapshot(comp); tot = sum(v["total_dense_bytes"] for v in s.values()) / sum(v["total_sent_bytes"] for v in s.values())
        line += f" ratio {tot:.1f} density {mean}"
    print(line, flush=True)
if hasattr(comp, "memory"):
    for k, v in snapshot(comp).items():
        print(k, {a: round(b, 6) for a, b in v.items() if a in ("key_size","tau_key","tau_sparse","family","alpha","beta","elements")})
