"""EngineConfig: everything needed to build an Engine."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cached_property

import torch

from .checks import checked_bool, checked_int, checked_real
from .distributed.info import TPInfo
from .errors import ConfigError
from .models.config import ModelConfig
from .models.size import check_checkpoint_size

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


# batch_invariant's attention backend and layer kernels per device: each reduces every row or token alone.
INVARIANT_BACKENDS: dict[str, tuple[str, str]] = {
    "cpu": ("torch", "torch_invariant"),
    "cuda": ("triton_invariant", "triton_invariant"),
}


@dataclass
class EngineConfig:
    model_path: str
    tp_info: TPInfo = field(default_factory=TPInfo)
    # "auto": float32 on CPU (exact parity with HF), bfloat16 on CUDA.
    dtype: torch.dtype | str = "auto"
    device: str = "auto"
    max_running_req: int = 16
    # Each backend/kernels field names a registry entry: "torch" (the reference), a faster one, or "auto".
    attention_backend: str = "auto"
    layer_kernels: str = "auto"
    step_kernels: str = "auto"
    moe_backend: str = "auto"
    sampler_backend: str = "auto"
    cuda_graph_bs: list[int] | None = None
    cuda_graph_max_bs: int | None = None
    page_size: int = 1
    memory_ratio: float = 0.9
    cpu_kv_cache_bytes: int = 2 * 1024**3
    distributed_timeout: float = 60.0
    distributed_port: int = 2333
    use_dummy_weight: bool = False
    # Each request's logits bitwise those of its solo run, whatever the batch (INVARIANT_BACKENDS run it).
    batch_invariant: bool = False
    max_seq_len_override: int | None = None
    num_page_override: int | None = None

    def __post_init__(self) -> None:
        """Check every field, read or not (a bad port fails here, not at TP 2); numbers are stored as Python ones."""

        def positive_int(name: str, value: object) -> int:
            return checked_int(ConfigError, name, value, lambda v: v >= 1, "use an int >= 1")

        if not isinstance(self.model_path, (str, os.PathLike)):
            raise ConfigError(f"model_path={self.model_path!r} is invalid: pass the model directory as a str or Path")
        if not isinstance(self.tp_info, TPInfo):
            raise ConfigError(f"tp_info={self.tp_info!r} is invalid: use TPInfo(rank, size)")
        for name in ("device", "attention_backend", "layer_kernels", "step_kernels", "moe_backend", "sampler_backend"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid: use a string, e.g. 'auto'")
        for name in ("page_size", "max_running_req", "cpu_kv_cache_bytes"):
            setattr(self, name, positive_int(name, getattr(self, name)))
        for name in ("max_seq_len_override", "num_page_override", "cuda_graph_max_bs"):
            if getattr(self, name) is not None:
                setattr(self, name, positive_int(name, getattr(self, name)))
        if self.cuda_graph_bs is not None:
            if not isinstance(self.cuda_graph_bs, (list, tuple)):
                raise ConfigError(f"cuda_graph_bs={self.cuda_graph_bs!r} is invalid: use a list of batch sizes")
            self.cuda_graph_bs = [positive_int(f"cuda_graph_bs[{i}]", bs) for i, bs in enumerate(self.cuda_graph_bs)]
        self.memory_ratio = checked_real(
            ConfigError, "memory_ratio", self.memory_ratio, lambda v: 0 < v <= 1, "use a number in (0, 1]"
        )
        self.distributed_timeout = checked_real(
            ConfigError, "distributed_timeout", self.distributed_timeout, lambda v: 0 < v < math.inf,
            "use a finite number of seconds > 0",
        )
        self.distributed_port = checked_int(
            ConfigError, "distributed_port", self.distributed_port, lambda v: 1 <= v <= 65535,
            "use a TCP port in [1, 65535]",
        )
        self.use_dummy_weight = checked_bool(ConfigError, "use_dummy_weight", self.use_dummy_weight)
        self.batch_invariant = checked_bool(ConfigError, "batch_invariant", self.batch_invariant)
        if isinstance(self.dtype, str) and self.dtype != "auto" and self.dtype not in DTYPES:
            raise ConfigError(f"dtype={self.dtype!r} is not supported; use 'auto' or one of {sorted(DTYPES)}")
        if not isinstance(self.dtype, (str, torch.dtype)):
            raise ConfigError(f"dtype={self.dtype!r} is invalid: use 'auto', a name like 'bfloat16', or a torch.dtype")
        if isinstance(self.dtype, torch.dtype) and self.dtype not in DTYPES.values():
            raise ConfigError(f"dtype={self.dtype} is not supported; use float32, float64, bfloat16 or float16")

    @cached_property
    def model_config(self) -> ModelConfig:
        model_config = ModelConfig.from_dir(self.model_path)
        if not self.use_dummy_weight:
            check_checkpoint_size(model_config, self.model_path)
        return model_config

    def invariant_backends(self, device: str) -> tuple[str, str]:
        """The attention backend and layer kernels batch_invariant runs on `device` ("auto" picks them), or
        ConfigError where the fields name others."""
        wanted = INVARIANT_BACKENDS[device]
        given = (self.attention_backend, self.layer_kernels)
        if any(g not in ("auto", w) for w, g in zip(wanted, given)):
            raise ConfigError(
                f"batch_invariant=True on {device} runs attention_backend={wanted[0]!r} and layer_kernels="
                f"{wanted[1]!r} ('auto' picks them); got attention_backend={given[0]!r}, layer_kernels={given[1]!r}"
            )
        return wanted

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if isinstance(self.dtype, torch.dtype):
            return self.dtype
        if self.dtype == "auto":
            return torch.bfloat16 if device.type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    @property
    def max_seq_len(self) -> int:
        return self.max_seq_len_override or self.model_config.max_position_embeddings
