"""Communication between TP ranks. A single rank needs none, so it gets NullComm."""

from __future__ import annotations

from typing import Protocol

import torch
import torch.distributed as dist


class Comm(Protocol):
    def min_int(self, value: int) -> int: ...
    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor: ...
    def destroy(self) -> None: ...


class NullComm:
    def min_int(self, value: int) -> int:
        return value

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def destroy(self) -> None:
        pass


class TorchDistComm:
    """torch.distributed over gloo (CPU) or NCCL (one GPU per rank); owns its process group."""

    def __init__(self, rank: int, size: int, port: int, timeout_s: float, device: torch.device) -> None:
        from datetime import timedelta

        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL binds a rank to the current device: this rank's, not cuda:0
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=timedelta(seconds=timeout_s),
        )
        self.device = device  # NCCL reduces device tensors only; gloo host tensors

    def min_int(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return int(t.item())

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor

    def destroy(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
