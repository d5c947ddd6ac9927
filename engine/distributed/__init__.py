"""Tensor-parallel rank info and communication."""

from .comm import Comm, NullComm, TorchDistComm
from .info import TPInfo

__all__ = ["Comm", "NullComm", "TPInfo", "TorchDistComm"]
