"""The static driver: pages, the request lifecycle (requests) and the overlap loop, composed by StaticDriver."""

from .loop import DECODE_LOOKAHEAD
from .pages import Contiguous, Interleaved, LayoutKind, PageAllocator, PageLayout, PageOrder, Pages, Shuffled
from .requests import Generation, RequestState
from .static import DriverClaim, StaticDriver

__all__ = [
    "DECODE_LOOKAHEAD",
    "Contiguous",
    "DriverClaim",
    "Generation",
    "Interleaved",
    "LayoutKind",
    "PageAllocator",
    "PageLayout",
    "PageOrder",
    "Pages",
    "RequestState",
    "Shuffled",
    "StaticDriver",
]
