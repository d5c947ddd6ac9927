"""KV pages for the driver: the hand-out order (a PageOrder policy), the allocator's free list and reservations, and
the mapping of a request's pages into its page-table row, all or nothing, when a step needs them."""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar, get_args, runtime_checkable

import torch

from ..checks import checked_int
from ..core import Req
from ..device import host_tensor, upload
from ..engine import Engine
from ..errors import CapacityError, ConfigError

LayoutKind = Literal["contiguous", "shuffled", "interleaved"]


class Holder(Protocol):

    req: Req
    pages: list[int]
    reserved_pages: int


H = TypeVar("H", bound=Holder)


@runtime_checkable
class PageOrder(Protocol):
    """The free list's order at start, and the order a batch's pages are taken."""

    def free_list(self, num_pages: int) -> list[int]: ...

    def grants(self, need: Sequence[int]) -> list[int]:
        ...


class Contiguous:

    def free_list(self, num_pages: int) -> list[int]:
        return list(range(num_pages))

    def grants(self, need: Sequence[int]) -> list[int]:
        return [i for i, k in enumerate(need) for _ in range(k)]


@dataclass(frozen=True)
class Shuffled(Contiguous):

    seed: int

    def free_list(self, num_pages: int) -> list[int]:
        order = list(range(num_pages))
        random.Random(self.seed).shuffle(order)
        return order


class Interleaved(Contiguous):
    """A batch takes pages round-robin across its requests."""

    def grants(self, need: Sequence[int]) -> list[int]:
        return [i for r in range(max(need, default=0)) for i, k in enumerate(need) if k > r]


@dataclass(frozen=True)
class PageLayout:
    """A PageOrder by name: contiguous, shuffled (with a seed) or interleaved."""

    kind: LayoutKind = "contiguous"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in get_args(LayoutKind):
            raise ConfigError(f"PageLayout kind={self.kind!r} is invalid: use one of {list(get_args(LayoutKind))}")
        object.__setattr__(self, "seed", checked_int(ConfigError, "PageLayout seed", self.seed, lambda v: True,
                                                     "use an int"))

    def order(self) -> PageOrder:
        if self.kind == "shuffled":
            return Shuffled(self.seed)
        return Interleaved() if self.kind == "interleaved" else Contiguous()


class PageAllocator:
    def __init__(self, num_pages: int, order: PageOrder) -> None:
        free = order.free_list(num_pages)
        if sorted(free) != list(range(num_pages)):  # a user's policy: a lost or doubled page would corrupt KV
            raise ConfigError(f"{type(order).__name__}.free_list({num_pages}) must be a permutation of its pages")
        self.free: deque[int] = deque(free)
        self.reserved = 0
        self.total = num_pages

    @property
    def available(self) -> int:
        return len(self.free) - self.reserved

    def reserve(self, n: int) -> None:
        if n > self.total:
            raise CapacityError(
                f"the request needs {n} KV page(s) but the pool has only {self.total}; it can never fit: shorten "
                "the prompt, lower max_tokens, or build the engine with more pages (memory_ratio, num_page_override)"
            )
        if n > self.available:
            raise CapacityError(
                f"the request needs {n} KV page(s) but only {self.available} are free; wait for running "
                "requests to finish, or build the engine with more pages (memory_ratio, num_page_override)"
            )
        self.reserved += n

    def peek(self, n: int) -> list[int]:
        return list(itertools.islice(self.free, n))

    def take(self, n: int) -> list[int]:
        """The first n free pages, out of the reservation."""
        assert self.reserved >= n, "take() past the reservation"
        self.reserved -= n
        free = self.free
        return [free.popleft() for _ in range(n)]

    def untake(self, page: int) -> None:
        """Undo the last take() of `page`."""
        self.free.appendleft(page)
        self.reserved += 1

    def release(self, pages: list[int], unused_reservation: int) -> None:
        self.free.extendleft(reversed(pages))
        self.reserved -= unused_reservation


class Pages:

    def __init__(self, engine: Engine, order: PageOrder) -> None:
        self.engine = engine
        self.order = order
        self.page_size = engine.config.page_size
        self.allocator = PageAllocator(engine.num_pages, order)

    def grants(self, seqs: Sequence[H], upto: Sequence[int]) -> list[H]:
        """The request of each page needed for slots [0, upto), in the order taken."""
        return [seqs[i] for i in self._grant_order(seqs, upto)]

    def _grant_order(self, seqs: Sequence[H], upto: Sequence[int]) -> list[int]:
        need = [max(0, -(-n // self.page_size) - len(seq.pages)) for seq, n in zip(seqs, upto)]
        order = self.order.grants(need)
        if sorted(order) != [i for i, k in enumerate(need) for _ in range(k)]:
            raise ConfigError(f"{type(self.order).__name__}.grants({list(need)}) must name request i need[i] times")
        return order

    def map(self, seqs: Sequence[H], upto: Sequence[int]) -> list[H]:
        """All or nothing: rows written first (nothing reads past a request's pages), then pages taken; returns
        one entry per page granted (for unmap)."""
        order = self._grant_order(seqs, upto)
        if not order:
            return []
        taken: list[list[int]] = [[] for _ in seqs]
        for i, page in zip(order, self.allocator.peek(len(order))):
            taken[i].append(page)
        self.write([(seq.req.table_idx, len(seq.pages) * self.page_size, got) for seq, got in zip(seqs, taken) if got])
        self.allocator.take(len(order))
        for seq, got in zip(seqs, taken):
            seq.pages.extend(got)
        return [seqs[i] for i in order]

    def unmap(self, grants: Sequence[Holder]) -> None:
        """Give back what map() granted, last first."""
        for seq in reversed(grants):
            self.allocator.untake(seq.pages.pop())

    def release(self, seq: Holder) -> None:
        self.allocator.release(seq.pages, seq.reserved_pages - len(seq.pages))
        seq.pages = []

    def write(self, writes: list[tuple[int, int, list[int]]]) -> None:
        """(row, first position, pages): the pages hold the row's consecutive positions from the first on."""
        table = self.engine.page_table
        width, ps = table.shape[1], self.page_size
        flat: list[int] = []
        slots: list[int] = []
        for row, start, pages in writes:
            n = max(0, min(len(pages) * ps, width - start))
            flat.extend(range(row * width + start, row * width + start + n))
            slots.extend(pages[:n] if ps == 1 else [page * ps + offset for page in pages for offset in range(ps)][:n])
        with self.engine.device.stream_context():  # ordered after the passes in flight that read the table
            packed = upload(host_tensor(flat + slots), table.device)
            table.view(-1)[packed[: len(flat)]] = packed[len(flat) :].to(torch.int32)
