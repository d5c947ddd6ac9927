"""One spawned process per tensor-parallel rank, for the TP tests: rank_main(rank, port, *args, queue) builds its
rank's engine on a free localhost port and puts (rank, result) on the queue."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(rank_main: Callable[..., None], size: int, *args: Any, timeout_s: float = 180.0) -> dict[int, Any]:
    """Every rank's result by rank; a rank that exits with an error raises here."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(rank, port, *args, queue)) for rank in range(size)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=timeout_s) for _ in procs)
    for rank, p in enumerate(procs):
        p.join(timeout=60)
        if p.exitcode != 0:
            raise RuntimeError(f"TP rank {rank} exited with code {p.exitcode}")
    return results
