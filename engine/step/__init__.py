"""The decode step's home: its packed inputs (inputs, layout), the slot rule (slots), its kernels (kernels, with the
Triton ones in triton) and its outputs with their undo (record)."""

from .kernels import STEP_KERNELS, StepKernels
from .record import ForwardOutput, StepRecord

__all__ = ["STEP_KERNELS", "ForwardOutput", "StepKernels", "StepRecord"]
