"""The decode step's home: its packed inputs (inputs), the slot rule (slots), its kernels (kernels, triton) and
its outputs with their undo (record)."""

from .kernels import STEP_KERNELS, StepKernels, TorchStepKernels, keep_tokens
from .record import ForwardOutput, StepRecord

__all__ = ["STEP_KERNELS", "ForwardOutput", "StepKernels", "StepRecord", "TorchStepKernels", "keep_tokens"]
