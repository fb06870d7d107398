"""Per-call time of a small all-reduce on one host's shared buffers, with nothing else in the processes.

Usage: python benchmarks/per_call.py N [prof [sort]]

N local processes each make 1,000 back-to-back ``gradsync.all_reduce`` calls of 4 KB
(``algorithm="one_shot"``, ``transport="shm"``), then 1,000 calls of the reads alone (the
shared buffers' C all-reduce, what is left without the front door); each rank prints its wall and
CPU time per call. With ``prof``, rank 0 profiles 500 more calls (cProfile, sorted by ``sort``).
"""
import cProfile
import pstats
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def body(rank, n, port, prof):
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, n, is_master=(rank == 0))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=n)
    import gradsync
    from gradsync.runtime import reads
    from gradsync.runtime.transport import for_group
    x = torch.randn(1024)
    for _ in range(50): gradsync.all_reduce(x, algorithm="one_shot", transport="shm")
    dist.barrier()
    t = time.perf_counter(); c0 = time.process_time()
    for _ in range(1000): gradsync.all_reduce(x, algorithm="one_shot", transport="shm")
    wall = (time.perf_counter() - t) / 1000; cpu = (time.process_time() - c0) / 1000
    tr = for_group("shm"); buf = tr.shared_buffers()
    program = lambda m: reads.packed("one_shot", n, m, rank)
    dist.barrier()
    t = time.perf_counter(); c0 = time.process_time()
    for _ in range(1000): buf.all_reduce(x, "sum", program, time.monotonic() + 10)
    wall2 = (time.perf_counter() - t) / 1000; cpu2 = (time.process_time() - c0) / 1000
    if rank == 0 and prof:
        pr = cProfile.Profile(); pr.enable()
        for _ in range(500): gradsync.all_reduce(x, algorithm="one_shot", transport="shm")
        pr.disable(); pstats.Stats(pr).sort_stats(sys.argv[3] if len(sys.argv)>3 else "tottime").print_stats(25)
    elif prof:
        for _ in range(500): gradsync.all_reduce(x, algorithm="one_shot", transport="shm")
    print(f"rank {rank}: all_reduce wall {wall*1e6:.0f} us cpu {cpu*1e6:.0f} us; reads wall {wall2*1e6:.0f} us cpu {cpu2*1e6:.0f} us", flush=True)
    dist.barrier()
if __name__ == "__main__":
    n = int(sys.argv[1]); prof = len(sys.argv) > 2
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    mp.start_processes(body, args=(n, port, prof), nprocs=n, start_method="spawn")
