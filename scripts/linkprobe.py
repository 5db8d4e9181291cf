"""Ping-pong latency and bandwidth between rank 0 and every other rank (mpi4py).

    horovodrun -np 2 -hostfile hostfiles/edge --mpi python scripts/linkprobe.py --out probe.json

Rank 0 sends a message of each size to rank r, which sends it back; one-way time is half the
median round trip. Latency is that of the smallest size, bandwidth that of the largest.
"""
import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI


def round_trips(comm, peer, size, repeats):
    buf = np.zeros(size, np.uint8)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        comm.Send(buf, dest=peer)
        comm.Recv(buf, source=peer)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def echo(comm, size, repeats):
    buf = np.zeros(size, np.uint8)
    for _ in range(repeats):
        comm.Recv(buf, source=0)
        comm.Send(buf, dest=0)


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 65536, 4 << 20])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out")
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    results = {}
    for peer in range(1, size):
        for n in args.sizes:
            if rank == 0:
                results[f"{peer}/{n}"] = round_trips(comm, peer, n, args.repeats) / 2
            elif rank == peer:
                echo(comm, n, args.repeats)
        comm.Barrier()
    if rank == 0:
        host = MPI.Get_processor_name()
        summary = {"ranks": size, "host0": host, "one_way_s": results,
                   "latency_ms": {p: 1e3 * results[f"{p}/{args.sizes[0]}"] for p in range(1, size)},
                   "bandwidth_MBps": {p: args.sizes[-1] / results[f"{p}/{args.sizes[-1]}"] / 1e6
                                      for p in range(1, size)}}
        for peer in range(1, size):
            print(f"link 0<->{peer}: latency {summary['latency_ms'][peer]:.2f} ms, "
                  f"bandwidth {summary['bandwidth_MBps'][peer]:.1f} MB/s", flush=True)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
