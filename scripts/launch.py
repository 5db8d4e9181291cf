"""horovodrun with checked host names and a failure message that names the node.

    python scripts/launch.py -np 2 -hostfile hostfiles/edge --gloo python scripts/train.py ...

Takes horovodrun's own arguments and passes them on unchanged. Before the
launch, every host in ``-H``/``-hostfile`` must be a plain host name or
address (no shell syntax can reach an ssh command line), and every remote
host must pass ``ssh HOST true`` under the user's own host-key policy:
horovodrun itself runs ssh with ``StrictHostKeyChecking=no``. When the
launch fails, the last line says which rank on which host exited first
(Horovod itself only gives the rank).

It also gives horovodrun's children the Horovod settings in ``HOROVOD_DEFAULTS``, each only
where the user has not set it: a variable already in the environment, or horovodrun's own flag
(``--cycle-time-ms``, ``--cache-capacity``, ``--fusion-threshold-mb``, which horovodrun writes
over the environment), wins. ``HVD_GRADPART_LAUNCH_DEFAULTS=0`` turns them off; so does
``--autotune``, which tunes what a fixed setting would pin. docs/cluster.md gives the
measurements behind each value.
"""
import argparse
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
from horovod.runner.util.network import filter_local_addresses

HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?")
FIRST_FAILURE = re.compile(r"^Process name: (\d+)\s*$")
EXIT_CODE = re.compile(r"^Exit code: (-?\d+)\s*$")
# Horovod coordinates the ranks once per cycle, also while idle, and every cycle crosses the link:
# a 2 ms cycle (Horovod's default is 1 ms) cut the idle link traffic by a third at no measured
# step time; longer cycles cut more but each collective round waits for one (docs/cluster.md).
# The response cache and tensor fusion stay at Horovod's defaults: either off put more bytes on the link.
HOROVOD_DEFAULTS = {"HOROVOD_CYCLE_TIME": "2"}
SWITCH = "HVD_GRADPART_LAUNCH_DEFAULTS"
WHY = {255: "its ssh connection dropped or the process was killed",
       137: "killed (SIGKILL, e.g. out of memory)", 143: "terminated (SIGTERM)"}


class HostError(ValueError):
    """A host entry that is not a plain host name with a slot count."""


def check_host(name, where):
    if not HOST.fullmatch(name):
        raise HostError(f"{where}: invalid host name {name!r}: use letters, digits, '.', '-' and '_' only")


def read_hosts(hosts=None, hostfile=None):
    """``"host:slots,..."`` from ``-H`` or a hostfile, every entry checked.

    Raises:
        HostError: an entry is not ``HOST:SLOTS`` (``HOST slots=N`` in a hostfile).
        OSError: the hostfile cannot be read.
    """
    entries = []
    if hostfile:
        for i, line in enumerate(Path(hostfile).read_text().splitlines(), 1):
            where = f"{hostfile} line {i}"
            m = re.fullmatch(r"(\S+) slots=(\d+)", line.strip())
            if not m:
                raise HostError(f"{where}: expected 'HOST slots=N', got {line!r}")
            check_host(m.group(1), where)
            entries.append(f"{m.group(1)}:{m.group(2)}")
    else:
        for entry in (hosts or "").split(","):
            name, _, slots = entry.strip().rpartition(":")
            if not slots.isdigit():
                raise HostError(f"-H entry {entry!r}: expected HOST:SLOTS")
            check_host(name, f"-H entry {entry!r}")
            entries.append(f"{name}:{slots}")
    return ",".join(entries)


def rank_hosts(hosts, np):
    """Horovod's own rank-to-host assignment for a static launch."""
    return {s.rank: s.hostname for s in get_host_assignments(parse_hosts(hosts), np)}


def check_host_keys(names, port=None, identity=None):
    """Runs ``ssh HOST true`` on every remote host with the user's own host-key checking.

    Args:
        names: host names or addresses; local ones are skipped (Horovod starts those without ssh).
        port, identity: horovodrun's ``--ssh-port`` and ``--ssh-identity-file``, if given.

    Raises:
        HostError: a host's key is unknown or changed, or ssh cannot log in.
    """
    for host in filter_local_addresses(sorted(set(names))):
        extra = [*(["-p", str(port)] if port else []), *(["-i", identity] if identity else [])]
        done = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *extra, host, "true"],
                              capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            raise HostError(f"ssh {host} true failed with your own host-key checking on ({why}); "
                            f"check the host's key and accept it once by hand (ssh {host} true)")


def child_env(environ, autotune=False):
    """The environment for horovodrun: ``environ`` plus ``HOROVOD_DEFAULTS`` where it sets nothing.

    Returns:
        (env, applied): the new environment and the defaults it added.
    """
    env = dict(environ)
    if autotune or env.get(SWITCH) == "0" or env.get("HOROVOD_AUTOTUNE", "0") not in ("", "0"):
        return env, {}
    applied = {k: v for k, v in HOROVOD_DEFAULTS.items() if k not in env}
    env.update(applied)
    return env, applied


def failure_line(output, ranks):
    """Names the rank and host that exited first, from Horovod's closing message."""
    first = code = None
    for line in output:
        if m := FIRST_FAILURE.match(line):
            first = int(m.group(1))
        elif m := EXIT_CODE.match(line):
            code = int(m.group(1))
    if first is None:
        return "launch.py: error: the launch failed before any rank exited (see the messages above)"
    why = f": {WHY[code]}" if code in WHY else ""
    return (f"launch.py: error: rank {first} on {ranks.get(first, '?')} failed first "
            f"(exit {code}{why}); Horovod stopped the other ranks")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("-np", "--num-proc", type=int)
    p.add_argument("-H", "--hosts")
    p.add_argument("-hostfile", "--hostfile")
    p.add_argument("-p", "--ssh-port", type=int)
    p.add_argument("-i", "--ssh-identity-file")
    p.add_argument("--autotune", action="store_true")
    known, _ = p.parse_known_args(argv)
    if not known.num_proc:
        sys.exit("launch.py: error: give -np N (and -H HOSTS or -hostfile FILE) as to horovodrun")
    try:
        hosts = read_hosts(known.hosts or f"localhost:{known.num_proc}", known.hostfile)
        ranks = rank_hosts(hosts, known.num_proc)
        check_host_keys(ranks.values(), known.ssh_port, known.ssh_identity_file)
    except (HostError, OSError, ValueError, subprocess.TimeoutExpired) as e:
        print(f"launch.py: error: {e}", file=sys.stderr)
        return 2
    env, applied = child_env(os.environ, known.autotune)
    if applied:
        print("launch.py: Horovod settings " + " ".join(f"{k}={v}" for k, v in applied.items())
              + " (launch.py's defaults; set them yourself to override)", file=sys.stderr, flush=True)
    run = subprocess.Popen([str(Path(sys.executable).with_name("horovodrun")), *argv], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    signal.signal(signal.SIGTERM, lambda *_: run.terminate())
    tail = []
    for line in run.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        tail = (tail + [line])[-50:]
    code = run.wait()
    if code != 0:
        print(failure_line(tail, ranks), file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
