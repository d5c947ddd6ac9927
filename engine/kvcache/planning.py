"""How many KV pages fit: pages = (memory_ratio × free_before − model_bytes) // bytes_per_page.

model_bytes is what loading the model took: measured on CUDA (free memory before minus after), the parameter bytes
on CPU. Every TP rank must agree, so the caller takes the minimum across ranks. On CPU the pool is also capped by
cpu_kv_cache_bytes, since "free RAM" is shared with everything else on the host.
"""

from __future__ import annotations

from ..errors import CapacityError

MIN_PAGES = 2


def model_footprint(param_bytes: int, measured: int | None) -> int:
    """What the model takes: the measured drop in free memory, never less than its parameters (memory another
    process frees while the model loads would otherwise count against the model as negative)."""
    return param_bytes if measured is None else max(measured, param_bytes)


def plan_num_pages(
    free_before: int,
    model_bytes: int,
    bytes_per_page: int,
    memory_ratio: float,
    cap_bytes: int | None = None,
) -> int:
    available = int(memory_ratio * free_before) - model_bytes
    pages = max(available, 0) // bytes_per_page
    if cap_bytes is not None:
        pages = min(pages, cap_bytes // bytes_per_page)
    if pages < MIN_PAGES:
        raise CapacityError(
            f"only {pages} KV page(s) of {bytes_per_page} bytes fit (free={free_before} B, "
            f"model={model_bytes} B, memory_ratio={memory_ratio}, cap={cap_bytes}); at least {MIN_PAGES} are "
            "needed: raise memory_ratio or cpu_kv_cache_bytes, lower page_size, or free memory"
        )
    return pages

