"""A captured step's FlashInfer page ids in one Triton launch (flashinfer_backend.graph_page_ids states them)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PAGE_BLOCK = 256


@triton.jit
def _page_ids_kernel(table_ptr, stride_row, rows_ptr, indptr_ptr, out_ptr, PS: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    p = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    start = tl.load(indptr_ptr + b)
    used = p < tl.load(indptr_ptr + b + 1) - start
    row = tl.load(rows_ptr + b)
    slot = tl.load(table_ptr + row * stride_row + p * PS, mask=used, other=0)
    tl.store(out_ptr + start + p, (slot // PS).to(tl.int32), mask=used)


def page_ids(
    page_table: torch.Tensor, table_rows: torch.Tensor, kv_indptr: torch.Tensor, max_pages: int, page_size: int,
    out: torch.Tensor,
) -> None:
    bs = table_rows.shape[0]
    _page_ids_kernel[(bs, triton.cdiv(max_pages, PAGE_BLOCK))](
        page_table, page_table.stride(0), table_rows, kv_indptr, out, PS=page_size, BLOCK=PAGE_BLOCK
    )
