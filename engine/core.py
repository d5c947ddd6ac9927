"""The engine's data model: sampling parameters, requests, batches and the forward context."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from .checks import checked_bool, checked_int, checked_real, checked_seed, token_list
from .errors import InvalidRequestError

if TYPE_CHECKING:
    from .attention.base import BaseAttnBackend, BaseAttnMetadata
    from .distributed.comm import Comm
    from .kvcache.pool import KVCachePool
    from .layers.kernels import LayerKernels
    from .step.layout import InputLayout

Phase = Literal["prefill", "decode"]


_FLOAT32_TINY = 1.1754943508222875e-38


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters, validated on construction, with HF's semantics and order (temperature, top-k,
    top-p, min-p; docs/sampling.md). temperature 0 is greedy; top_k -1 disables top-k."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    max_tokens: int = 16
    ignore_eos: bool = False
    seed: int | None = None

    def __post_init__(self) -> None:
        def normalize(name: str, value: object) -> None:  # store NumPy or Fraction values as Python ones
            object.__setattr__(self, name, value)

        err = InvalidRequestError
        t = checked_real(err, "temperature", self.temperature, lambda v: math.isfinite(v) and v >= 0,
                         "use a finite number >= 0 (0 means greedy)")
        if 0 < t < _FLOAT32_TINY:  # float32 logits are divided by it
            raise err(f"temperature={self.temperature!r} is invalid: a nonzero temperature must be >= "
                      f"{_FLOAT32_TINY:.4g}; use 0 for greedy")
        normalize("temperature", t)
        normalize("top_k", checked_int(err, "top_k", self.top_k, lambda v: v >= 1 or v == -1,
                                       "use an int >= 1, or -1 to disable top-k"))
        normalize("top_p", checked_real(err, "top_p", self.top_p, lambda v: 0 < v <= 1,
                                        "use a number in (0, 1] (1 disables top-p)"))
        normalize("min_p", checked_real(err, "min_p", self.min_p, lambda v: 0 <= v <= 1,
                                        "use a number in [0, 1] (0 disables min-p)"))
        normalize("max_tokens", checked_int(err, "max_tokens", self.max_tokens, lambda v: v >= 1, "use an int >= 1"))
        normalize("ignore_eos", checked_bool(err, "ignore_eos", self.ignore_eos))
        if self.seed is not None:
            normalize("seed", checked_seed(err, "seed", self.seed))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


class Req:
    """One request: ``token_ids`` (Python ints) is the prompt and every token appended; ``[0, cached_len)`` has KV on
    the device and this pass computes ``[cached_len, device_len)``. A prefill chunk that ends early yields no token."""

    def __init__(
        self,
        input_ids: Sequence[int] | torch.Tensor,
        table_idx: int,
        cached_len: int,
        output_len: int,
        uid: int,
        sampling_params: SamplingParams,
        cache_handle: Any = None,
    ) -> None:
        self.token_ids = token_list(input_ids, f"request {uid}: input_ids")
        self.table_idx = table_idx
        self.cached_len = cached_len
        self.device_len = len(self.token_ids)
        self.output_len = output_len
        self.uid = uid
        self.sampling_params = sampling_params
        self.cache_handle = cache_handle
        self.max_device_len = len(self.token_ids) + output_len

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def new_token_ids(self) -> list[int]:
        return self.token_ids[self.cached_len : self.device_len]

    @property
    def extend_len(self) -> int:
        return self.device_len - self.cached_len

    @property
    def is_partial_prefill(self) -> bool:
        return self.device_len < self.num_tokens

    @property
    def token_pending(self) -> bool:
        """The last token was sampled on the device and not appended yet (the next step reads it there)."""
        return self.num_tokens == self.device_len - 1

    @property
    def remain_len(self) -> int:
        return self.max_device_len - self.device_len

    def complete_one(self) -> None:
        partial = self.is_partial_prefill
        self.cached_len = self.device_len
        if not partial:
            self.device_len += 1

    def append_host(self, next_token: int | torch.Tensor) -> None:
        self.token_ids.append(int(next_token))

    def __repr__(self) -> str:
        return (
            f"Req(uid={self.uid}, table_idx={self.table_idx}, cached_len={self.cached_len}, "
            f"device_len={self.device_len}, output_len={self.output_len})"
        )


_EMPTY_INT32 = torch.empty(0, dtype=torch.int32)


@dataclass
class Batch:
    """The requests of one forward pass (``padded_reqs``: plus graph padding) and the device tensors built for them."""

    reqs: list[Req]
    phase: Phase
    # A graph step sets these to its graph's tensors, valid until the next replay of its size.
    input_ids: torch.Tensor = _EMPTY_INT32
    positions: torch.Tensor = _EMPTY_INT32
    out_loc: torch.Tensor = _EMPTY_INT32
    # int64 [padded_size]: the rows attention reads; all the dummy row when the slot verdict fails.
    table_rows: torch.Tensor = _EMPTY_INT32
    rows: torch.Tensor = _EMPTY_INT32  # int64 [size]
    slot_flags: torch.Tensor = _EMPTY_INT32  # bool: any True refuses the step
    padded_reqs: list[Req] = field(default_factory=list)
    # A graph batch's packed host inputs (engine/step/inputs.py); None for an eager pass.
    packed_inputs: tuple[torch.Tensor, InputLayout] | None = None
    attn_metadata: BaseAttnMetadata | None = None
    # Each request's (cached_len, device_len) at prepare_batch: a batch runs once, and the undo restores them.
    spans: list[tuple[int, int]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.padded_reqs:
            self.padded_reqs = list(self.reqs)

    @property
    def size(self) -> int:
        return len(self.reqs)

    @property
    def padded_size(self) -> int:
        return len(self.padded_reqs)

    @property
    def is_prefill(self) -> bool:
        return self.phase == "prefill"

    @property
    def is_decode(self) -> bool:
        return self.phase == "decode"


@dataclass
class Context:
    """What a forward pass reads besides the weights, and the batch while one runs; one per Engine, no global copy."""

    page_size: int
    page_table: torch.Tensor
    kv_cache: KVCachePool
    attn_backend: BaseAttnBackend
    kernels: LayerKernels
    comm: Comm
    # EngineConfig.batch_invariant: the attention backend then reduces each token alone.
    batch_invariant: bool = False
    _batch: Batch | None = None

    @property
    def batch(self) -> Batch:
        if self._batch is None:
            raise RuntimeError("Context.batch is only set inside forward_batch()")
        return self._batch

    @contextmanager
    def forward_batch(self, batch: Batch) -> Iterator[None]:
        if self._batch is not None:
            raise RuntimeError("forward_batch() is not re-entrant")
        self._batch = batch
        try:
            yield
        finally:
            self._batch = None
