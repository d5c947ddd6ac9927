"""An example plugin: one's own attention backend, registered by name and checked by the whole harness.

It wraps the torch reference backend; with ``$EXAMPLE_ATTENTION_BUG`` set to a number e (e.g. ``1e-3``) every
attention output is scaled by 1 + e, the kind of small slip a hand-written kernel makes (a wrong softmax scale, a
dropped rescale). Check it clean, then with the bug::

    pytest properties --plugin examples.my_attention --target cpu-fp32,attention=example
    EXAMPLE_ATTENTION_BUG=1e-3 pytest properties --plugin examples.my_attention --target cpu-fp32,attention=example
    python -m oracle verify --model DIR --plugin examples.my_attention --target cpu-fp32,attention=example

The flag is read when an engine builds the backend, so each engine keeps the behaviour it was built with.
"""

from __future__ import annotations

import os

import torch

from engine import ATTENTION_BACKENDS, Context
from engine.attention import TorchAttnBackend
from engine.kvcache import KVCachePool

BUG_ENV = "EXAMPLE_ATTENTION_BUG"


class ExampleAttnBackend(TorchAttnBackend):
    name = "example"

    def __init__(self, kv_cache: KVCachePool, page_table: torch.Tensor, num_qo_heads: int) -> None:
        super().__init__(kv_cache, page_table, num_qo_heads)
        self.scale = 1.0 + float(os.environ.get(BUG_ENV, "0") or 0)

    def forward(self, q: torch.Tensor, layer_id: int, ctx: Context) -> torch.Tensor:
        out = super().forward(q, layer_id, ctx)
        return out if self.scale == 1.0 else out * self.scale


# replace=True: importing the plugin twice (pytest and verify in one process) re-registers the same backend.
ATTENTION_BACKENDS.register(
    "example", lambda kv, table, heads, device: ExampleAttnBackend(kv, table, heads), replace=True
)
