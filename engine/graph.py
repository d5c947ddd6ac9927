"""The graph runner: captures decode steps as CUDA graphs and pads batches to a captured size.

On CPU (or with a backend that cannot be captured) it is disabled: pad_batch leaves the batch as it is and
every forward pass runs eagerly.
"""

from __future__ import annotations

import torch

from .core import Batch, Req


def default_graph_bs(max_bs: int) -> list[int]:
    """[1, 2, 4, 8, 16, 24, 32, …] up to max_bs: dense at small sizes, where decode batches usually are."""
    sizes = [bs for bs in (1, 2, 4, 8) if bs <= max_bs]
    sizes += list(range(16, max_bs + 1, 8))
    if not sizes or sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


class GraphRunner:
    def __init__(self, dummy_req: Req, bs_list: list[int], enabled: bool) -> None:
        self.dummy_req = dummy_req
        self.enabled = enabled
        self.bs_list = sorted(bs_list) if enabled else []
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    @property
    def max_bs(self) -> int:
        return self.bs_list[-1] if self.bs_list else 0

    def can_use_graph(self, batch: Batch) -> bool:
        return self.enabled and batch.is_decode and batch.size <= self.max_bs

    def padded_size(self, bs: int) -> int:
        return next(size for size in self.bs_list if size >= bs)

    def pad_batch(self, batch: Batch) -> None:
        """Pad a graph-eligible decode batch with dummy requests, which only touch the dummy page."""
        if not self.can_use_graph(batch):
            batch.padded_reqs = list(batch.reqs)
            return
        extra = self.padded_size(batch.size) - batch.size
        batch.padded_reqs = list(batch.reqs) + [self.dummy_req] * extra

    def replay(self, batch: Batch) -> torch.Tensor:
        graph = self.graphs.get(batch.padded_size)
        if graph is None:
            raise RuntimeError(f"no CUDA graph was captured for batch size {batch.padded_size}")
        raise NotImplementedError("graph replay arrives with the CUDA path")

    def destroy(self) -> None:
        self.graphs.clear()
