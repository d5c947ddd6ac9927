"""Paged KV storage and its sizing."""

from .planning import model_footprint, plan_num_pages
from .pool import KVCachePool

__all__ = ["KVCachePool", "model_footprint", "plan_num_pages"]
