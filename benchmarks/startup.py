"""The first step, split: tracing, then the first call (graph set-up and XLA), then a step.

    python -m benchmarks.startup --models mlp lenet5 resnet20 mobilenetv2 \
        --methods none powersgd gradpart --groups 1 0 --out results/startup.jsonl

Each case (model, method, Horovod group count) is a fresh two-rank launch on this machine
(``horovodrun -np 2 -H localhost:2``, one TF thread pair per rank), so no compile cache is
shared. It builds ``training.make_step`` as ``scripts/train.py`` does, on a batch of 32 digits
shaped as the time-to-accuracy matrix trains them (28x28x1), then times on rank 0:
``trace_s``, ``get_concrete_function`` alone; ``first_call_s``, the first call of the traced
step (TensorFlow's graph optimization, kernel creation, every XLA compilation and one step);
``step_s``, the median of the next steps; and ``first_step_s = trace_s + first_call_s``, what
train.py reports as the first step. The traced graph is counted: its nodes (the step and every
function it calls), its ``If``/``While`` ops and the functions XLA must compile. Rows go to
``--out`` (JSON lines) and a Markdown table beside it.

    python -m benchmarks.startup --passes --out results/startup-passes.jsonl

times GradPart's one pass over a gradient (``SparseCompressor._sweep``) at sizes from 1 Ki to
1 Mi elements, in one process and thread: XLA's compile (its first call less a call) and a call,
against the same pass as plain kernels. It sets ``fused.XLA_MIN_ELEMENTS``.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 32


def graph_counts(concrete):
    """Nodes, control-flow ops and XLA-compiled functions of a traced function and its library."""
    graph = concrete.graph.as_graph_def()
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    kinds = [n.op for n in nodes]
    xla = [f for f in graph.library.function if f.attr["_XlaMustCompile"].b]
    return {"nodes": len(nodes), "conds": sum(k in ("If", "StatelessIf") for k in kinds),
            "loops": sum(k in ("While", "StatelessWhile") for k in kinds), "xla_functions": len(xla)}


def measure(model_name, method, groups, steps):
    """One case on this rank: the timings and counts of the module doc."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from harness import training
    from harness.models import DIGITS, build_model
    from hvd_gradpart import get_compressor

    hvd.init()
    training.limit_threads(1)
    tf.keras.utils.set_random_seed(0)
    model = build_model(model_name, DIGITS, 10)
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    step = training.make_step(model, optimizer, get_compressor(method), num_groups=groups)
    rng = np.random.default_rng(hvd.rank())
    batch = (tf.constant(rng.random((BATCH, *DIGITS), dtype=np.float32)),
             tf.constant(rng.integers(0, 10, BATCH).astype(np.int32)))
    training.broadcast_initial_state(model, optimizer)
    hvd.allreduce(tf.zeros([1]), name="startup_barrier")
    start = time.perf_counter()
    concrete = step.get_concrete_function(*batch)
    trace_s = time.perf_counter() - start
    start = time.perf_counter()
    step(*batch)[0].numpy()
    first_call_s = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step(*batch)[0].numpy()
        times.append(time.perf_counter() - start)
    return {"model": model_name, "method": method, "groups": groups, "gradients": len(model.trainable_variables),
            "trace_s": trace_s, "first_call_s": first_call_s, "first_step_s": trace_s + first_call_s,
            "step_s": statistics.median(times), **graph_counts(concrete)}


def passes(sizes, calls=50):
    """GradPart's sweep at each size: compiled (first call, then a call) against plain kernels."""
    import tensorflow as tf

    from harness import training
    from hvd_gradpart import GradPartCompressor, stats

    training.limit_threads(1)
    compressor = GradPartCompressor()
    as64 = lambda v: tf.constant(v, tf.float64)
    plan = (stats.Fit(as64(0.0), as64(1.0), as64(2.0), tf.constant(0)), as64(10.0), as64(1.0), as64(2.5), as64(3.0))
    plain = tf.function(compressor._sweep.python_function)
    rows = []
    for n in sizes:
        grad, residual = tf.random.normal([n], seed=1), tf.random.normal([n], seed=2)
        timed = []
        for sweep in (compressor._sweep, plain):
            start = time.perf_counter()
            sweep(residual, grad, {}, plan)[3].numpy()
            first = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(calls):
                out = sweep(residual, grad, {}, plan)
            out[3].numpy()
            timed.append((first, (time.perf_counter() - start) / calls))
        (first, call), (_, plain_call) = timed
        rows.append({"elements": n, "compile_s": first - call, "xla_us": 1e6 * call, "plain_us": 1e6 * plain_call})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def passes_table(rows):
    lines = ["| elements | XLA compile ms | XLA call us | plain call us | plain - XLA us |", "|---|---|---|---|---|"]
    lines += [f"| {r['elements']} | {1000 * r['compile_s']:.0f} | {r['xla_us']:.0f} | {r['plain_us']:.0f} "
              f"| {r['plain_us'] - r['xla_us']:.0f} |" for r in rows]
    return "\n".join(lines) + "\n"


def launch(model_name, method, groups, steps):
    """One case in a fresh two-rank launch; rank 0's row."""
    cmd = [str(Path(sys.executable).parent / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, "-m", "benchmarks.startup",
           "--one", model_name, method, str(groups), "--steps", str(steps)]
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    rows = [line.split("RESULT ", 1)[1] for line in done.stdout.splitlines() if "RESULT " in line]
    if done.returncode != 0 or not rows:
        raise SystemExit(f"startup: {model_name} {method} groups={groups} failed (exit {done.returncode}):\n"
                         + "\n".join((done.stdout + done.stderr).splitlines()[-30:]))
    return json.loads(rows[0])


def table(rows):
    """Markdown: one line per case, and each method's first step over no compression's."""
    base = {(r["model"], r["groups"]): r["first_step_s"] for r in rows if r["method"] == "none"}
    lines = ["| model | gradients | groups | method | trace s | first call s | first step s | vs none | step ms "
             "| nodes | conds | loops | XLA functions |", "|" + "---|" * 13]
    for r in rows:
        ratio = r["first_step_s"] / base[(r["model"], r["groups"])] if (r["model"], r["groups"]) in base else None
        lines.append(f"| {r['model']} | {r['gradients']} | {r['groups']} | {r['method']} | {r['trace_s']:.1f} "
                     f"| {r['first_call_s']:.1f} | {r['first_step_s']:.1f} | "
                     f"{'' if ratio is None else f'{ratio:.2f}x'} | {1000 * r['step_s']:.0f} | {r['nodes']} "
                     f"| {r['conds']} | {r['loops']} | {r['xla_functions']} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["mlp", "lenet5", "resnet20", "mobilenetv2"])
    p.add_argument("--methods", nargs="+", default=["none", "powersgd", "gradpart"])
    p.add_argument("--groups", type=int, nargs="+", default=[1, 0], help="Horovod group counts (0: per tensor)")
    p.add_argument("--steps", type=int, default=5, help="steps timed after the first")
    p.add_argument("--out", default=str(ROOT / "results" / "startup.jsonl"))
    p.add_argument("--passes", action="store_true", help="time the compiled pass against plain kernels")
    p.add_argument("--one", nargs=3, metavar=("MODEL", "METHOD", "GROUPS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        row = measure(args.one[0], args.one[1], int(args.one[2]), args.steps)
        import horovod.tensorflow as hvd
        if hvd.rank() == 0:
            print("RESULT " + json.dumps(row), flush=True)
        return
    if args.passes:
        rows = passes([1 << b for b in range(10, 21, 2)] + [36864, 147456, 802816])
        Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
        Path(args.out).with_suffix(".md").write_text(passes_table(rows))
        return
    rows = []
    with open(args.out, "w") as out:
        for model_name in args.models:
            for groups in args.groups:
                for method in args.methods:
                    rows.append(launch(model_name, method, groups, args.steps))
                    out.write(json.dumps(rows[-1]) + "\n")
                    out.flush()
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    Path(args.out).with_suffix(".md").write_text(table(rows))


if __name__ == "__main__":
    main()
