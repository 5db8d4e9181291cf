"""Elastic training with GradPart on the three-node edge cluster: nodes leave and come back.

    scripts/edge_cluster.sh up --nodes 3
    flock /tmp/hvd_gradpart_cluster.lock .venv/bin/python -m benchmarks.elastic \\
        --seeds 0 1 2 --out results/elastic.json

One ``faulted`` run of ``scripts/elastic_loop.py`` per seed (3 ranks, ``--min-np 2``, host
discovery that follows which nodes answer): edge-c's training process is killed mid-run; the
job must go on with two ranks and take edge-c in again when Horovod's cooldown ends; then (with
``link``) edge-c's link is cut, the two others go on, and the link comes back. Every wait is
bounded; a wait that runs out raises ``Stalled``. A ``reference`` run of the same seed and
steps has no fault. ``summarize`` reads every rank's step records: the timeline of world sizes,
the steps each reset rolled back, whether all ranks held the same weights at every step, the
residual norm the leaving rank took with it against the applied gradient's norm (and, over every
step of every rank, what a rank leaving then would have taken), and the test accuracy.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP = ROOT / "scripts" / "elastic_loop.py"
DISCOVER = ROOT / "scripts" / "discover_hosts.sh"
HOSTFILE = ROOT / "hostfiles" / "edge3"
VICTIM = "edge-c"
COOLDOWN_S = (10, 15)  # Horovod's blacklist cooldown: a failed node is taken in again after it
GLOO_TIMEOUT_S = 30  # Horovod's default: a collective with a cut node fails after it, and a joining
# rank must reach hvd.init() within it (about 15 s here under load), else every rank aborts
ELASTIC_TIMEOUT_S = 120  # horovodrun's wait for --min-np slots
EVENT_TIMEOUT_S = 150  # the most any awaited event may take
END_TIMEOUT_S = 300  # from the last fault to the launch's exit


class Stalled(RuntimeError):
    """An awaited event did not come in time (or the launch ended first)."""


class Ended(Stalled):
    """The launch ended before an awaited event."""


def records(prefix):
    """Every rank's step records of the run logged under ``prefix``, by time."""
    found = []
    for path in Path(prefix).parent.glob(Path(prefix).name + ".*.jsonl"):
        found += [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
    return sorted(found, key=lambda r: r["t"])


def launch(prefix, seed, epochs, step_delay, out):
    """Starts the elastic job; returns its ``Popen`` (in a session of its own)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_S)}
    cmd = [str(Path(sys.executable).with_name("horovodrun")), "-np", "3", "--min-np", "2", "--max-np", "3",
           "--host-discovery-script", f"{DISCOVER} {HOSTFILE}", "--blacklist-cooldown-range", *map(str, COOLDOWN_S),
           "--elastic-timeout", str(ELASTIC_TIMEOUT_S), "--start-timeout", "120", "--gloo",
           sys.executable, str(LOOP), "--seed", str(seed), "--epochs", str(epochs),
           "--step-delay", str(step_delay), "--steps-jsonl", str(prefix), "--stop-file", f"{prefix}.stop"]
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)


def wait_for(what, check, job, timeout=EVENT_TIMEOUT_S):
    """Polls ``check()`` until it returns a true value (returned); raises ``Stalled`` after
    ``timeout`` seconds or when the job ends first."""
    deadline = time.time() + timeout
    while not (found := check()):
        if job.poll() is not None:
            raise Ended(f"the job ended (exit {job.returncode}) before {what}")
        if time.time() > deadline:
            raise Stalled(f"no {what} within {timeout}s")
        time.sleep(0.5)
    return found


def namespace_pids(node, script, marker):
    """The processes in ``node``'s namespace running ``script`` with ``marker`` among their
    arguments (one run's training processes)."""
    pids = []
    for pid in subprocess.run(["ip", "netns", "pids", node], capture_output=True, text=True).stdout.split():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if str(script) in argv and str(marker) in argv:
            pids.append(int(pid))
    return pids


def worker_pids(node, prefix):
    """The training processes of this run (``prefix`` on their command line) in ``node``'s namespace."""
    return namespace_pids(node, LOOP, prefix)


def set_link(node, up):
    subprocess.run(["ip", "link", "set", f"gpv-{node}", "up" if up else "down"], check=True)


def faulted(prefix, seed, epochs, step_delay, link=True, stop=False):
    """The faulted run (module doc); returns ``{"events": [(name, unix time)], "exit": code}``.
    ``stop`` ends the job 10 steps after the node's last return (its stop file), so that it
    lasts no longer than the faults need; else it runs its ``epochs``, and the faults that came
    before their end are the run."""
    events = []
    note = lambda name: events.append((name, time.time()))
    of = lambda host, **match: [r for r in records(prefix) if r["host"] == host
                                and all(r[k] == v for k, v in match.items())]
    with open(f"{prefix}.launch.log", "w") as out:
        job = launch(prefix, seed, epochs, step_delay, out)
        note("launch")
        try:
            first = wait_for(f"20 steps on {VICTIM}", lambda: len(of(VICTIM, size=3)) >= 20 and of(VICTIM), job)
            victim = first[0]["pid"]
            os.kill(victim, signal.SIGKILL)
            note(f"kill {VICTIM}")
            wait_for("a step with 2 ranks", lambda: of("edge-a", size=2), job)
            note("running with 2")
            wait_for(f"{VICTIM} back", lambda: [r for r in of(VICTIM, size=3) if r["pid"] != victim], job)
            note(f"{VICTIM} back")
            if link:
                since = len(of("edge-a"))
                wait_for("10 more steps", lambda: len(of("edge-a")) >= since + 10, job)
                cut = time.time()
                set_link(VICTIM, up=False)
                note(f"link of {VICTIM} down")
                try:
                    wait_for("a step with 2 ranks after the cut",
                             lambda: [r for r in of("edge-a", size=2) if r["t"] > cut], job)
                    note("running with 2")
                    for pid in worker_pids(VICTIM, prefix):  # the cut node's stale process
                        os.kill(pid, signal.SIGKILL)
                finally:
                    set_link(VICTIM, up=True)
                note(f"link of {VICTIM} up")
                stale = {r["pid"] for r in of(VICTIM)}
                wait_for(f"{VICTIM} back after the cut", lambda: [r for r in of(VICTIM, size=3)
                                                                   if r["pid"] not in stale], job)
                note(f"{VICTIM} back")
            if stop:
                since = len(of("edge-a"))
                wait_for("10 steps with the node back", lambda: len(of("edge-a")) >= since + 10, job)
                Path(f"{prefix}.stop").touch()
                note("stop file")
            job.wait(timeout=END_TIMEOUT_S)
            note("end")
        except Ended:
            if stop:
                raise
            note("end")  # its epochs outran the faults: what happened until then is the run
        except subprocess.TimeoutExpired:
            raise Stalled(f"the job still ran {END_TIMEOUT_S}s after the last fault") from None
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)  # horovodrun and its ssh clients
                job.wait()
            for node in ("edge-a", "edge-b", VICTIM):
                for pid in worker_pids(node, prefix):
                    os.kill(pid, signal.SIGKILL)
    return {"events": events, "exit": job.returncode}


def reference(prefix, seed, epochs, step_delay):
    """The same seed and epochs with no fault; returns the exit code."""
    with open(f"{prefix}.launch.log", "w") as out:
        job = launch(prefix, seed, epochs, step_delay, out)
        try:
            return job.wait(timeout=END_TIMEOUT_S + EVENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Stalled("the reference run outlived its bound") from None
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()


def summarize(prefix, events=()):
    """What a run's records and launch log show (module doc)."""
    recs = records(prefix)
    start = min([t for _, t in events] + [r["t"] for r in recs])
    by_step = defaultdict(dict)  # (steps, size) -> {host: crc of its last record there}
    for r in recs:
        by_step[(r["steps"], r["size"])][r["host"]] = r["crc"]
    differing = sorted(key for key, crcs in by_step.items() if len(set(crcs.values())) > 1)
    sizes, lost, last = [], [], None  # world-size changes; steps rolled back at each reset (rank 0)
    for r in (r for r in recs if r["rank"] == 0):
        if not sizes or sizes[-1][1] != r["size"]:
            sizes.append((round(r["t"] - start, 1), r["size"]))
            if last is not None:
                lost.append(last["steps"] + 1 - r["steps"])
        last = r
    departures = []  # the last record of every process that did not finish the run
    final_pids = {r["pid"] for r in recs if r["steps"] == recs[-1]["steps"]} if recs else set()
    for pid in {r["pid"] for r in recs} - final_pids:
        r = max((r for r in recs if r["pid"] == pid), key=lambda r: r["t"])
        departures.append({"host": r["host"], "steps": r["steps"], "unsent_norm": r["unsent_norm"],
                           "grad_norm": r["grad_norm"], "ratio": r["unsent_norm"] / r["grad_norm"]})
    ratios = sorted(r["unsent_norm"] / r["grad_norm"] for r in recs if r["grad_norm"] > 0)
    at = lambda q: round(ratios[min(len(ratios) - 1, int(q * len(ratios)))], 3) if ratios else None
    log = Path(f"{prefix}.launch.log").read_text()
    final = [json.loads(line.split(":", 1)[1]) for line in log.splitlines() if '"final": true' in line]
    return {"timeline": sizes, "events": [(name, round(t - start, 1)) for name, t in events],
            "steps_lost": lost, "steps": recs[-1]["steps"] if recs else 0, "ranks_differ_at": differing[:10],
            "checked_steps": len(by_step), "departures": departures,
            "unsent_ratio": {"median": at(0.5), "p90": at(0.9), "max": at(1.0),
                             "zero_share": round(sum(x == 0 for x in ratios) / max(len(ratios), 1), 3)},
            "test_acc": final[0]["test_acc"] if final else None}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--step-delay", type=float, default=0.05)
    p.add_argument("--no-link", action="store_true", help="kill a process only; leave the links up")
    p.add_argument("--kind", choices=("both", "faulted", "reference"), default="both")
    p.add_argument("--work", default="/tmp/hvd_gradpart_elastic", help="folder for the step records and logs")
    p.add_argument("--out", help="JSON summary file")
    args = p.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    runs = []
    for seed in args.seeds:
        stamp = time.strftime("%H%M%S")
        if args.kind != "reference":
            prefix = Path(args.work) / f"faulted-{seed}-{stamp}"
            run = faulted(prefix, seed, args.epochs, args.step_delay, link=not args.no_link)
            runs.append({"seed": seed, "kind": "faulted", "exit": run["exit"], **summarize(prefix, run["events"])})
            print(json.dumps(runs[-1]), flush=True)
        if args.kind != "faulted":
            ref = Path(args.work) / f"reference-{seed}-{stamp}"
            code = reference(ref, seed, args.epochs, args.step_delay)
            runs.append({"seed": seed, "kind": "reference", "exit": code, **summarize(ref)})
            print(json.dumps(runs[-1]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"epochs": args.epochs, "step_delay": args.step_delay, "runs": runs},
                                             indent=1) + "\n")


if __name__ == "__main__":
    main()
