"""Paged KV storage and its sizing."""

from .planning import plan_num_pages
from .pool import KVCachePool

__all__ = ["KVCachePool", "plan_num_pages"]
