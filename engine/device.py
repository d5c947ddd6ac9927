"""CPU/CUDA device abstraction: streams, events, free memory and thread setup; on CPU every "async" step is synchronous.
"""

from __future__ import annotations

import array
import importlib.util
import itertools
import os
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from .errors import ConfigError


class Event(Protocol):
    def record(self) -> None: ...
    def synchronize(self) -> None: ...
    def query(self) -> bool: ...


class NullEvent:

    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class NullStream:
    def synchronize(self) -> None:
        pass


class OnStream:
    """torch.cuda.stream(stream) without its per-call lookups of the current device (several a step, a few µs each on
    the host): the stream is made current, and the current streams of its device and of the current one come back."""

    def __init__(self, stream: torch.cuda.Stream) -> None:
        self.stream = stream
        self.saved: list[torch.cuda.Stream] = []

    def __enter__(self) -> None:
        here, there = torch.cuda.current_device(), self.stream.device_index
        self.saved = [torch.cuda.current_stream(there)]
        if here != there:  # setting a stream makes its device current: the caller's device is put back last
            self.saved.append(torch.cuda.current_stream(here))
        torch.cuda.set_stream(self.stream)

    def __exit__(self, *exc: object) -> None:
        for stream in self.saved:
            torch.cuda.set_stream(stream)


@dataclass
class Device:

    torch_device: torch.device
    stream: torch.cuda.Stream | NullStream

    @property
    def is_cuda(self) -> bool:
        return self.torch_device.type == "cuda"

    def stream_context(self) -> AbstractContextManager[object]:
        if isinstance(self.stream, torch.cuda.Stream):
            return OnStream(self.stream)
        return nullcontext()

    def record_event(self) -> Event:
        """An event recorded on the engine's stream now."""
        if isinstance(self.stream, torch.cuda.Stream):
            event = torch.cuda.Event()
            event.record(self.stream)
            return event
        return NullEvent()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def free_memory(self) -> int:
        """Bytes free for the KV pool: device memory on CUDA, available RAM on CPU."""
        if self.is_cuda:
            free, _total = torch.cuda.mem_get_info(self.torch_device)
            return int(free)
        return available_host_memory()


_TYPECODES = {torch.int64: "q", torch.int32: "i", torch.float64: "d", torch.float32: "f", torch.bool: "B"}


def host_tensor(values: Sequence[float], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """A 1-D host tensor of `values` built through array.array: torch.tensor on a list costs ~10x more per step."""
    if not values:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(array.array(_TYPECODES[dtype], values), dtype=dtype)


def upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host to device without waiting; the host tensor may be freed at once (CUDA stages a pageable source)."""
    return host.to(device, non_blocking=True)


def flashinfer_installed() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def triton_kernels_run_on(device: torch.device) -> bool:
    """Whether the sampler's Triton kernels serve `device`: CUDA, with triton installed."""
    return device.type == "cuda" and importlib.util.find_spec("triton") is not None


def resolve_device(name: str, tp_rank: int = 0) -> torch.device:
    """'auto' → cuda:<rank> when a GPU is present, else cpu. Explicit names are checked."""
    if name == "auto":
        return torch.device(f"cuda:{tp_rank}") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name!r} is not a device name; use 'auto', 'cpu' or 'cuda[:N]'") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={name!r} but no CUDA GPU is available; use device='cpu' or 'auto'"
            )
        index = tp_rank if dev.index is None else dev.index
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device={name!r}: only {torch.cuda.device_count()} GPU(s) are visible")
        return torch.device("cuda", index)
    if dev.type != "cpu":
        raise ConfigError(f"device={name!r} is not supported; supported: 'auto', 'cpu', 'cuda[:N]'")
    return dev


def make_device(dev: torch.device) -> Device:
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
        return Device(dev, torch.cuda.Stream(dev))
    return Device(dev, NullStream())


def available_host_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def physical_cores() -> int:
    """Physical cores: hyper-threads share one core's matmul units."""
    try:
        cores: set[tuple[str, str]] = set()
        phys = core = ""
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("physical id"):
                    phys = line.split(":")[1].strip()
                elif line.startswith("core id"):
                    core = line.split(":")[1].strip()
                    cores.add((phys, core))
        if cores:
            return min(len(cores), len(os.sched_getaffinity(0)))
    except (OSError, AttributeError):
        pass
    return os.cpu_count() or 1


def cpu_threads_for(tp_size: int) -> int | None:
    if os.environ.get("OMP_NUM_THREADS"):
        return None
    return max(1, physical_cores() // tp_size)


class ThreadCount:
    """torch's per-process CPU thread count: the first claim saves it, the last release puts it back."""

    def __init__(self) -> None:
        self._holders: set[int] = set()
        self._tokens = itertools.count()
        self._saved: int | None = None
        self._lock = threading.Lock()

    def claim(self, threads: int) -> int:
        with self._lock:
            if not self._holders:
                self._saved = torch.get_num_threads()
            token = next(self._tokens)
            self._holders.add(token)
            torch.set_num_threads(threads)
            return token

    def release(self, token: int) -> None:
        with self._lock:
            if token not in self._holders:
                return
            self._holders.discard(token)
            if not self._holders and self._saved is not None:
                torch.set_num_threads(self._saved)
                self._saved = None


CPU_THREADS = ThreadCount()
