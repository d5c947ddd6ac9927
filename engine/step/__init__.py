"""The decode step: packed inputs (inputs, layout), the slot rule (slots), kernels (kernels, triton), undo (record)."""

from .kernels import STEP_KERNELS, StepKernels
from .record import ForwardOutput, StepRecord

__all__ = ["STEP_KERNELS", "ForwardOutput", "StepKernels", "StepRecord"]
