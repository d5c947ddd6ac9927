"""How many KV pages fit: (memory_ratio × free_before − model_bytes) // bytes_per_page, capped on CPU by
cpu_kv_cache_bytes (free RAM is the whole host's); the caller takes the minimum across TP ranks.
"""

from __future__ import annotations

from ..errors import CapacityError

MIN_PAGES = 2


def model_footprint(param_bytes: int, measured: int | None) -> int:
    """The measured drop in free memory, never less than the parameters (another process may free memory)."""
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

