"""Kernel mutants: the bugs the op-level properties (properties/test_op_*.py) exist for. They live at the
boundaries strategies must reach: a tile tail, a softmax past float32's exp overflow, an element offset past 2**31, a
slot written twice, a write past the slots asked for, a fused kernel that stores K before its RoPE, a kernel that
silently hands its work to the reference, a host copy read before it lands, a norm whose sum of squares stops at the
first block."""

from __future__ import annotations

import contextlib
import importlib
import types
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from engine.attention import torch_backend
from engine.layers.kernels import TORCH_KERNELS, TorchKernels, TritonKernels
from engine.step import ForwardOutput, slots
from engine.step.kernels import StepKernels

from .base import swap

TILE = 64

_ORIGINAL_TORCH_STORE_KV = TorchKernels.store_kv
_ORIGINAL_SLOT_VERDICT = slots.slot_verdict
_ORIGINAL_TRITON_RMS_NORM = TritonKernels.rms_norm
_ORIGINAL_TRITON_NORM_ROPE_STORE = TritonKernels.norm_rope_store
_ORIGINAL_INPUT_IDS = StepKernels.input_ids


def _bool_mask(q: torch.Tensor, k: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
    """SDPA's own masking as one boolean mask: is_causal (top-left, q as long as k here) or attn_mask or nothing."""
    q_len, kv_len = q.shape[-2], k.shape[-2]
    if is_causal:
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril()
    if attn_mask is None:
        return torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device)
    return attn_mask


def _sdpa_tile_tail_dropped(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
    is_causal: bool = False, **kw: Any,
) -> torch.Tensor:
    """Keys past the last whole 64-key tile are never loaded once a sequence passes one tile: the kernel's loop runs
    kv_len // BLOCK_N full tiles and forgets the masked tail."""
    kv_len = k.shape[-2]
    if kv_len <= TILE or kv_len % TILE == 0:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kw)
    loaded = torch.arange(kv_len, device=q.device) < kv_len - kv_len % TILE
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_bool_mask(q, k, attn_mask, is_causal) & loaded, **kw)


def _sdpa_softmax_without_max(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
    is_causal: bool = False, enable_gqa: bool = False, **kw: Any,
) -> torch.Tensor:
    """exp(s) / sum exp(s) in float32 without subtracting the row maximum: past a score of ~88.7 exp overflows to
    inf and the row becomes inf / inf = NaN."""
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    scores = (q.float() @ k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    weights = scores.exp().masked_fill(~_bool_mask(q, k, attn_mask, is_causal), 0.0)
    return ((weights / weights.sum(dim=-1, keepdim=True)) @ v.float()).to(q.dtype)


def _store_kv_int32_offsets(
    self: TorchKernels, k_slots: torch.Tensor, v_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    loc: torch.Tensor,
) -> None:
    """The element offset slot * stride is computed in 32 bits: past 2**31 it wraps, and the row lands elsewhere."""
    stride = k_slots.stride(0)
    offset = (loc.long() * stride + 2**31) % 2**32 - 2**31
    _ORIGINAL_TORCH_STORE_KV(self, k_slots, v_slots, k, v, torch.div(offset, stride, rounding_mode="floor"))


def _store_kv_one_past(
    self: TorchKernels, k_slots: torch.Tensor, v_slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    loc: torch.Tensor,
) -> None:
    """The last token's K/V is also written one slot further on (a store loop that runs one iteration too many)."""
    _ORIGINAL_TORCH_STORE_KV(self, k_slots, v_slots, k, v, loc)
    nxt = loc[-1:].long() + 1
    if len(loc) and int(nxt) < k_slots.shape[0]:
        _ORIGINAL_TORCH_STORE_KV(self, k_slots, v_slots, k[-1:], v[-1:], nxt)


def _slot_verdict_counting_once(table: torch.Tensor, cached: torch.Tensor, device_len: torch.Tensor,
                                out_loc: torch.Tensor, *rest: Any) -> torch.Tensor:
    """The count of writes per slot is a store, not an add: a slot written twice in one batch counts once."""
    return _ORIGINAL_SLOT_VERDICT(table, cached, device_len, out_loc.unique(), *rest)


def _rms_norm_quietly_on_torch(self: TritonKernels, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Batches of more than 8 rows go to the torch reference, and declines() says nothing of it."""
    if x.numel() // x.shape[-1] > 8:
        return TORCH_KERNELS.rms_norm(x, weight, eps)
    return _ORIGINAL_TRITON_RMS_NORM(self, x, weight, eps)


def _norm_rope_store_k_unrotated(
    self: TritonKernels, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rope: Any, q_norm: Any, k_norm: Any,
    k_slots: torch.Tensor, v_slots: torch.Tensor, loc: torch.Tensor,
) -> torch.Tensor:
    """The fused op stores k as it was loaded, before its norm and RoPE: q is rotated, the cached keys are not."""
    out = _ORIGINAL_TRITON_NORM_ROPE_STORE(self, q, k, v, rope, q_norm, k_norm, k_slots, v_slots, loc)
    k_slots[loc.long()] = k.to(k_slots.dtype)
    return out


def _wait_for_nothing(self: ForwardOutput) -> None:
    """The host tokens are read without waiting for the device-to-host copy's event."""


def attention_tile_tail_dropped() -> contextlib.AbstractContextManager[None]:
    return swap(torch_backend, "F", types.SimpleNamespace(scaled_dot_product_attention=_sdpa_tile_tail_dropped))


def softmax_without_max() -> contextlib.AbstractContextManager[None]:
    return swap(torch_backend, "F", types.SimpleNamespace(scaled_dot_product_attention=_sdpa_softmax_without_max))


def store_kv_int32_offsets() -> contextlib.AbstractContextManager[None]:
    return swap(TorchKernels, "store_kv", _store_kv_int32_offsets)


def store_kv_one_past() -> contextlib.AbstractContextManager[None]:
    return swap(TorchKernels, "store_kv", _store_kv_one_past)


def slot_check_counts_once() -> contextlib.AbstractContextManager[None]:
    # redirected_slots reaches slot_verdict through engine.step.slots' module-level name; only that name is rebound.
    return swap(slots, "slot_verdict", _slot_verdict_counting_once)


def _batch_places(rows: torch.Tensor) -> torch.Tensor:
    """What both input-ids mutants pass for the requests' rows: their places in the batch."""
    return torch.arange(len(rows), dtype=rows.dtype, device=rows.device)


def _input_ids_batch_index_as_row(
    self: StepKernels, ids: torch.Tensor, pending: torch.Tensor, rows: torch.Tensor, token_req: torch.Tensor,
    last_tokens: torch.Tensor, kind: Any,
) -> torch.Tensor:
    """A pending token's id is read at its request's place in the batch, not at that request's row."""
    return _ORIGINAL_INPUT_IDS(self, ids, pending, _batch_places(rows), token_req, last_tokens, kind)


def input_ids_batch_index_as_row() -> contextlib.AbstractContextManager[None]:
    return swap(StepKernels, "input_ids", _input_ids_batch_index_as_row)


def _relaunched(
    name: str, launch: Callable[[Any, Any], Callable[..., Any]], module: str = "engine.step.triton"
) -> contextlib.AbstractContextManager[None]:
    """The Triton kernel `name` of `module` behind a stand-in whose `[grid](...)` launches call launch(kernel, grid)
    in place of kernel[grid] (imports triton: CUDA machines only)."""
    owner = importlib.import_module(module)
    kernel = getattr(owner, name)

    class _Launch:
        def __getitem__(self, grid: Any) -> Callable[..., Any]:
            return launch(kernel, grid)

    return swap(owner, name, _Launch())


def triton_input_ids_batch_index_as_row() -> contextlib.AbstractContextManager[None]:
    """The same bug in the Triton kernel: it is handed the requests' places in the batch for their rows."""

    def launch(kernel: Any, grid: Any) -> Callable[..., Any]:
        return lambda ids, pending, rows, *rest, **kw: kernel[grid](ids, pending, _batch_places(rows), *rest, **kw)

    return _relaunched("_input_ids_kernel", launch)


def keep_tokens_unclamped() -> contextlib.AbstractContextManager[None]:
    return swap(StepKernels, "keep_tokens", _keep_tokens_unclamped)


def _keep_tokens_unclamped(
    self: StepKernels, tokens: torch.Tensor, last_tokens: torch.Tensor, rows: torch.Tensor, flags: torch.Tensor
) -> torch.Tensor:
    """A row with nothing sampled keeps -1 as its last token: the next step's input id is -1."""
    before = last_tokens.index_select(0, rows)
    last_tokens.index_copy_(0, rows, tokens)
    return torch.cat([tokens, flags.to(torch.int32), before])


def triton_keep_tokens_read_contiguous() -> contextlib.AbstractContextManager[None]:
    """The Triton keep kernel reads the tokens as contiguous: a sampler's strided view hands it other rows' tokens."""
    return _relaunched("_keep_kernel", lambda kernel, grid: lambda tokens, stride, *rest, **kw: kernel[grid](
        tokens, 1, *rest, **kw))


def triton_rms_norm_undeclared_fallback() -> contextlib.AbstractContextManager[None]:
    return swap(TritonKernels, "rms_norm", _rms_norm_quietly_on_torch)


def triton_slot_count_skipped() -> contextlib.AbstractContextManager[None]:
    """The Triton slot check never launches its count kernel: a slot written twice (or over cached KV marked after
    it) passes."""
    return _relaunched("_slot_count_kernel", lambda kernel, grid: lambda *args, **kwargs: None)


def triton_hand_out_tail_dropped() -> contextlib.AbstractContextManager[None]:
    """The hand-out's grid takes the vocabulary's whole blocks (floor division for ceil): each row's tail past its last
    full block, and a vocabulary under one block entirely, is handed out as allocated."""

    def launch(kernel: Any, grid: tuple[int, int]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            whole = args[3] // kwargs["BLOCK"]  # args[3]: the vocabulary
            return kernel[(grid[0], whole)](*args, **kwargs) if whole else None

        return run

    return _relaunched("_hand_out_kernel", launch)


def triton_slot_flag_kept() -> contextlib.AbstractContextManager[None]:
    """The Triton slot check of a decode batch's layout never clears its flag after reading it: once one such batch
    is refused, every later one is too (state one step leaves for the next)."""
    return _relaunched("_slot_redirect_kernel", lambda kernel, grid: lambda *args, **kwargs: kernel[grid](
        *args, **{**kwargs, "RESET": False}))


def triton_rope_store_k_unrotated() -> contextlib.AbstractContextManager[None]:
    return swap(TritonKernels, "norm_rope_store", _norm_rope_store_k_unrotated)


@contextlib.contextmanager
def norm_gemv_rms_first_block() -> Any:
    """The norm folded into the GEMV takes each row's sum of squares over the first K block only (a reduction loop
    that stops after one tile): rows wider than the GEMV's K block are divided by the wrong rms."""
    from engine.layers import triton_gemv

    original = triton_gemv.norm_gemv

    def norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                  weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        n, k = weight.shape
        block_k = triton_gemv.gemv_blocks(x.numel() // k, n, k)[2]
        if k <= block_k:
            return original(x, residual, norm_weight, eps, weight, bias)
        total = x if residual is None else x + residual
        h = total.float()
        normed = norm_weight * (h * torch.rsqrt(h[..., :block_k].pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        return triton_gemv.gemv(normed, weight, bias, False), total

    with swap(triton_gemv, "norm_gemv", norm_gemv):
        yield


def gemv_grid_by_rule() -> contextlib.AbstractContextManager[None]:
    """The GEMV counts its launch grid with the general rule's columns a program while its kernel takes a one-row
    block of ONE_ROW_BLOCKS (the table read where the kernel is launched, not where the grid is sized): one row of
    o_proj's 1024 x 2048, 2 columns a program against the rule's 4, leaves half its outputs unwritten."""
    from engine.layers import triton_gemv

    def launch(kernel: Any, grid: Any) -> Callable[..., Any]:
        def run(x: Any, weight: Any, bias: Any, out: Any, m: int, n: int, *rest: Any, **kw: Any) -> Any:
            with swap(triton_gemv, "ONE_ROW_BLOCKS", {}):
                block_n = triton_gemv.gemv_blocks(m, n, kw["K"])[1]
            return kernel[(-(-n // block_n),)](x, weight, bias, out, m, n, *rest, **kw)

        return run

    return _relaunched("_gemv_kernel", launch, "engine.layers.triton_gemv")


@contextlib.contextmanager
def gemm_k_tail_dropped() -> Any:
    """The skinny GEMM's K loop runs whole BLOCK_K tiles only (range(0, K // BLOCK_K)): a product whose K is off the
    tile loses its last columns' terms, and one narrower than a tile is its bias alone."""
    from engine.layers import triton_gemm

    original = triton_gemm.gemm

    def gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, *args: Any) -> torch.Tensor:
        out = original(x, weight, bias, *args)
        k = weight.shape[1]
        kept = k // triton_gemm.BLOCK_K * triton_gemm.BLOCK_K
        if kept == k:
            return out
        lost = x.reshape(-1, k)[:, kept:].float() @ weight[:, kept:].float().T
        return (out.float() - lost.view(out.shape)).to(out.dtype)

    with swap(triton_gemm, "gemm", gemm):
        yield


def host_copy_unwaited() -> contextlib.AbstractContextManager[None]:
    return swap(ForwardOutput, "wait", _wait_for_nothing)
