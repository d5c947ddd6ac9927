"""NeoX-style rotary embedding with HF's cos/sin (including llama3 frequency scaling)."""

from __future__ import annotations

import math

import torch

from ..models.config import RopeConfig


def inv_frequencies(head_dim: int, rope: RopeConfig) -> torch.Tensor:
    # HF's expression, so the float32 values match bit for bit.
    inv_freq = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if rope.rope_type == "llama3":
        inv_freq = _llama3_scale(inv_freq, rope)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    old_len = rope.original_max_position_embeddings
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding:
    """A float32 cos/sin table per position; not a module buffer, as the model is built on the meta device."""

    def __init__(self, head_dim: int, max_positions: int, rope: RopeConfig, device: torch.device) -> None:
        inv_freq = inv_frequencies(head_dim, rope).to(device)
        pos = torch.arange(max_positions, device=device, dtype=torch.int64).float()
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos()
        self.sin = emb.sin()
        self._cast: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {torch.float32: (self.cos, self.sin)}

    def tables_in(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if dtype not in self._cast:
            self._cast[dtype] = (self.cos.to(dtype), self.sin.to(dtype))
        return self._cast[dtype]

    def at(self, positions: torch.Tensor) -> RotaryAt:
        return RotaryAt(self, positions)


class RotaryAt:
    """RoPE at one pass's positions; the torch path gathers cos/sin rows once per pass and dtype."""

    def __init__(self, table: RotaryEmbedding, positions: torch.Tensor) -> None:
        self.table = table
        self.positions = positions
        self._rows: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x: [tokens, heads, head_dim] rotated by each token's position."""
        rows = self._rows.get(x.dtype)
        if rows is None:
            cos, sin = self.table.tables_in(x.dtype)
            rows = self._rows[x.dtype] = (cos[self.positions].unsqueeze(1), sin[self.positions].unsqueeze(1))
        return _rotate(x, *rows)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
