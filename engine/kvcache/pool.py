"""The paged KV pool, one tensor [2, layers, pages, page_size, kv_heads, head_dim]: a slot is ``page * page_size +
offset``, the last page the dummy's; writes run on the layer kernels the caller passes, fused with q/k norm + RoPE.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..layers.kernels import HeadNorm, LayerKernels

if TYPE_CHECKING:  # rotary imports the models package, which imports the layers
    from ..layers.rotary import RotaryAt


class KVCachePool:
    def __init__(
        self,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.num_layers = num_layers
        self.num_pages = num_pages  # real pages; page `num_pages` is the dummy page
        self.page_size = page_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.buffer = torch.zeros(
            2, num_layers, num_pages + 1, page_size, num_kv_heads, head_dim, dtype=dtype, device=device
        )

    @property
    def dummy_page(self) -> int:
        return self.num_pages

    @property
    def num_slots(self) -> int:
        return (self.num_pages + 1) * self.page_size

    def k_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[0, layer]

    def v_cache(self, layer: int) -> torch.Tensor:
        return self.buffer[1, layer]

    def k_slots(self, layer: int) -> torch.Tensor:
        return self.buffer[0, layer].view(-1, self.num_kv_heads, self.head_dim)

    def v_slots(self, layer: int) -> torch.Tensor:
        return self.buffer[1, layer].view(-1, self.num_kv_heads, self.head_dim)

    def norm_rope_store(
        self, kernels: LayerKernels, layer: int, out_loc: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
        v: torch.Tensor, rope: RotaryAt, q_norm: HeadNorm | None, k_norm: HeadNorm | None,
    ) -> torch.Tensor:
        """A layer's new tokens: q and k normed and rotated, k and v stored at out_loc; the rotated q."""
        return kernels.norm_rope_store(q, k, v, rope, q_norm, k_norm, self.k_slots(layer), self.v_slots(layer), out_loc)

    @staticmethod
    def bytes_per_page(
        num_layers: int, page_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * head_dim * num_kv_heads * page_size * itemsize * num_layers
