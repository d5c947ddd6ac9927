"""What an op-level check runs on: the target's implementations, its device and dtype, and the ledger that proves
which implementation ran (oracle.ops.ledger)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from engine import LAYER_KERNELS, STEP_KERNELS
from engine.layers.kernels import LayerKernels, TorchKernels
from engine.registry import REFERENCE, Where
from engine.step.kernels import StepKernels, TorchStepKernels

from ..target import Target
from ..tolerance import KERNEL_ULPS
from .ledger import Ledger, expected_impl, label

T = TypeVar("T")


def kernel_impl(kernels: LayerKernels, method: str, name: str) -> str:
    """The implementation that serves LayerKernels.`method` of `kernels` (registered as `name`)."""
    return expected_impl(kernels, method, "kernels", name, (TorchKernels, LayerKernels))


def kernel_ulps(kernels: LayerKernels, method: str, name: str) -> int:
    """The op's contract: 0 (bitwise) where the torch reference serves it, else KERNEL_ULPS of HF's result."""
    return 0 if kernel_impl(kernels, method, name) == label("kernels", REFERENCE) else KERNEL_ULPS


@dataclass
class Bench:
    target: Target
    ledger: Ledger = field(default_factory=Ledger)

    def __post_init__(self) -> None:
        self.kernels_name = str(self.target.resolved("kernels"))
        self.kernels: LayerKernels = LAYER_KERNELS.factory(self.kernels_name)()
        where = Where(self.target.torch_device, self.target.torch_dtype, self.target.head_dim)
        self.step_name = STEP_KERNELS.resolve(self.target.step_kernels, where)
        self.step_kernels: StepKernels = STEP_KERNELS.factory(self.step_name)()

    @property
    def device(self) -> torch.device:
        return self.target.torch_device

    @property
    def dtype(self) -> torch.dtype:
        return self.target.torch_dtype

    def kernel_impl(self, method: str) -> str:
        return kernel_impl(self.kernels, method, self.kernels_name)

    def ulps(self, method: str) -> int:
        return kernel_ulps(self.kernels, method, self.kernels_name)

    def run_kernel(self, op: str, method: str, *args: object) -> object:
        """self.kernels.`method`(*args), traced and filed in the ledger under the implementation that ran."""
        return self.traced(op, self.kernel_impl(method), self.kernels.declines(method, *args),
                           lambda: getattr(self.kernels, method)(*args))

    def run_step_kernel(self, op: str, method: str, *args: object) -> object:
        """self.step_kernels.`method`(*args), traced and filed like run_kernel."""
        expected = expected_impl(self.step_kernels, method, "step", self.step_name, (TorchStepKernels, StepKernels))
        return self.traced(op, expected, self.step_kernels.declines(method, *args),
                           lambda: getattr(self.step_kernels, method)(*args))

    def traced(self, op: str, expected: str, declared: str | None, call: Callable[[], T]) -> T:
        with self.ledger.observe() as seen:
            out = call()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a fault inside the kernel surfaces here, in this example
        self.ledger.settle(op, seen, expected, declared)
        return out
