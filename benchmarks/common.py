"""What the benchmarks share: the target and model a run times, engine setup, prompts, timing and step harnesses.

A benchmark runs a target (oracle.target), cpu-fp32 on CPU and cuda-bf16 on CUDA unless one is named: its device,
dtype and backends. GPU runs use the Qwen3-0.6B shape (configs/qwen3-0.6b) with dummy weights; CPU runs use the
real SmolLM2-135M, built once into the cache by oracle.zoo.
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine import Engine, ForwardOutput, Req, SamplingParams
from engine.core import Batch
from engine.device import flashinfer_installed
from engine.sample import Sampler
from oracle.environment import cpu_model, flashinfer_version, git_commit
from oracle.target import Target, TargetError, parse
from oracle.target_spec import DEVICE_DEFAULTS

CONFIGS = Path(__file__).resolve().parent / "configs"
GPU_SHAPE = "qwen3-0.6b"


def has_cuda() -> bool:
    return torch.cuda.is_available()


def benchmark_target(text: str | None, device: str | None) -> Target:
    """What a benchmark command runs: the target `text` names (--target), else the preset of `device` (--device, else
    cuda where a GPU is visible); TargetError where it names another device or cannot run here."""
    target = parse(text or DEVICE_DEFAULTS[device or ("cuda" if has_cuda() else "cpu")])
    if device is not None and target.device != device:
        raise TargetError(f"--target {target.name} runs on {target.device}, not on --device {device}")
    return target.require()


def torch_info() -> dict[str, object]:
    """The torch side of where a benchmark ran: versions, the GPU (None without CUDA) and the CPU threads.

    pytest-benchmark's own machine_info (node, CPU, Python, OS) has none of it; benchmarks/conftest.py adds it there.
    """
    cuda = torch.cuda.is_available()
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name() if cuda else None,
        "gpu_count": torch.cuda.device_count() if cuda else 0,
        "flashinfer": flashinfer_version(),
        "torch_threads": torch.get_num_threads(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
    }


def machine_info() -> dict[str, object]:
    """Where a benchmark ran, for the JSON files benchmarks.compare and profile_step write: host, CPU, Python, torch."""
    return {
        "node": platform.node(),
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        **torch_info(),
    }


def command_line(module: str, argv: Sequence[str] | None = None) -> str:
    """How a benchmark module ran, for its JSON: the interpreter, -m module, and argv (else this process's)."""
    return shlex.join([Path(sys.executable).name, "-m", module, *(argv or sys.argv[1:])])


def write_record(path: Path, module: str, results: object) -> None:
    """A probe's JSON: its results with the commit, the command line and the machine they came from."""
    record = {"commit": git_commit(), "command": command_line(module), "machine": machine_info()}
    path.write_text(json.dumps({**record, "results": results}, indent=1))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def graph_us(fn: Callable[[], object], replays: int = 10) -> float:
    """µs per replay of a CUDA graph of fn (captured on a side stream after one warm-up call), the best of 3 runs."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            fn()
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        best = float("inf")
        for _ in range(3):
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            best = min(best, start.elapsed_time(end) / replays * 1e3)
    return best


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of fn(), with the device drained before and after."""
    return timed_both(fn, device)[0]


def timed_both(fn: Callable[[], object], device: torch.device) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of fn(), with the device drained before and after.

    On a shared CPU the CPU time is the steadier of the two: time slices lost to other processes do not count.
    """
    synchronize(device)
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    synchronize(device)
    return time.perf_counter() - wall, time.process_time() - cpu


@dataclass(frozen=True)
class ModelChoice:
    path: Path
    dummy: bool  # fill with dummy weights instead of loading *.safetensors
    dtype: torch.dtype
    label: str


def model_for(target: Target, model_dir: str | None = None, shape: str = GPU_SHAPE) -> ModelChoice:
    """The benchmark model of the target's device in its dtype, or model_dir (dummy weights if it holds no
    *.safetensors)."""
    dtype = target.torch_dtype
    if model_dir is not None:
        path = Path(model_dir)
        return ModelChoice(path, not any(path.glob("*.safetensors")), dtype, path.name)
    if target.device == "cuda":
        return ModelChoice(CONFIGS / shape, True, dtype, f"{shape} (dummy weights)")
    from oracle.zoo import smollm2_dir

    return ModelChoice(smollm2_dir(progress=False), False, dtype, "SmolLM2-135M-Instruct")


def build_engine(
    target: Target,
    choice: ModelChoice,
    max_running_req: int,
    kv_tokens: int | None,
    page_size: int = 1,
    graph_bs: list[int] | None = None,
    max_seq_len: int | None = None,
    **overrides: Any,
) -> Engine:
    """An engine of the target whose KV pool holds kv_tokens tokens (None: the engine's own memory planning), with
    CUDA graphs of graph_bs (None: the engine's sizes) where the target has graphs; overrides are further
    EngineConfig fields (e.g. attention_backend)."""
    pages = None if kv_tokens is None else -(-kv_tokens // page_size) + max_running_req
    graphs = {"cuda_graph_bs": graph_bs, "cuda_graph_max_bs": max(graph_bs) if graph_bs else None}
    config = target.engine_config(
        choice.path,
        max_running_req=max_running_req,
        page_size=page_size,
        use_dummy_weight=choice.dummy,
        num_page_override=pages,
        max_seq_len_override=max_seq_len,
        **(graphs if target.graphs else {}),
        **overrides,
    )
    return Engine(config, sampler_seed=0)


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (count, length), generator=gen).tolist()


# ---- graphs on/off in one engine ------------------------------------------------------------------------------
def graphs_captured(engine: Engine) -> bool:
    runner = engine.graph_runner
    return bool(runner.enabled and runner.graphs)


@contextmanager
def graphs(engine: Engine, on: bool) -> Iterator[None]:
    """Run with CUDA graphs (when captured) or eagerly: the same engine, weights and KV either way."""
    runner = engine.graph_runner
    saved = runner.enabled
    runner.enabled = saved and on
    try:
        yield
    finally:
        runner.enabled = saved


# ---- step harnesses: the same step, repeated --------------------------------------------------------------------
def _take_over(engine: Engine) -> None:
    """A step harness owns every row of its engine: the KV an earlier harness left there is dead."""
    engine.release_rows(range(engine.config.max_running_req))


def _map_slots(engine: Engine, row: int, start: int, count: int) -> None:
    slots = torch.arange(start, start + count, dtype=torch.int32)
    engine.page_table[row, :count] = slots.to(engine.device.torch_device)


class DecodeStep:
    """bs requests with `context` prompt tokens each, prefilled once; step() runs one decode step of all of them.

    Each step rewinds the requests to the same state first, so it rewrites the same KV slot and every call
    times the same work.
    """

    def __init__(
        self, engine: Engine, bs: int, context: int, seed: int = 0, params: Sequence[SamplingParams] | None = None
    ) -> None:
        """params: each request's sampling (default: greedy)."""
        self.engine = engine
        self.context = context
        vocab = engine.model_config.vocab_size
        span = -(-(context + 1) // engine.config.page_size) * engine.config.page_size
        greedy = SamplingParams(max_tokens=1, ignore_eos=True)
        self.reqs = []
        _take_over(engine)
        for i, prompt in enumerate(random_prompts(bs, context, vocab, seed)):
            _map_slots(engine, i, i * span, context + 1)
            p = greedy if params is None else params[i]
            self.reqs.append(Req(torch.tensor(prompt, dtype=torch.int32), i, 0, 1, i, p))
        batch, args = engine.prepare_batch(self.reqs, "prefill")
        out = engine.forward_batch(batch, args)
        out.copy_done_event.synchronize()
        for req, token in zip(self.reqs, out.next_tokens_cpu):
            req.append_host(token)

        self._in_flight: ForwardOutput | None = None
        self.graph_mode = "greedy"

    def _launch(self) -> ForwardOutput:
        for req in self.reqs:
            req.cached_len, req.device_len = self.context, self.context + 1
        batch, args = self.engine.prepare_batch(self.reqs, "decode")
        self.graph_mode = "greedy" if args.all_greedy else args.graph_mode or "logits"  # the graph a replay runs
        return self.engine.forward_batch(batch, args)

    def step(self) -> None:
        """One step, waited for: its latency."""
        self._launch()
        synchronize(self.engine.device.torch_device)

    def host_step(self) -> float:
        """One step from an idle device, waited for; returns the host wall seconds until its launch returned."""
        synchronize(self.engine.device.torch_device)
        start = time.perf_counter()
        self._launch()
        host = time.perf_counter() - start
        synchronize(self.engine.device.torch_device)
        return host

    def pipelined_step(self) -> None:
        """One step started, then the previous one's tokens waited for, as the overlapped driver runs: the time
        per step in a stream of them."""
        out = self._launch()
        if self._in_flight is not None:
            self._in_flight.wait()
        self._in_flight = out


class PrefillStep:
    """One request of `length` tokens; step() prefills all of it (no prefix cached)."""

    def __init__(self, engine: Engine, length: int, seed: int = 0) -> None:
        self.engine = engine
        self.length = length
        prompt = random_prompts(1, length, engine.model_config.vocab_size, seed)[0]
        _take_over(engine)
        _map_slots(engine, 0, 0, length + 1)
        self.req = Req(torch.tensor(prompt, dtype=torch.int32), 0, 0, 1, 0, SamplingParams(max_tokens=1))

    def step(self) -> None:
        self.req.cached_len, self.req.device_len = 0, self.length
        batch, args = self.engine.prepare_batch([self.req], "prefill")
        self.engine.forward_batch(batch, args)
        synchronize(self.engine.device.torch_device)


# ---- kernels per step ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepProfile:
    steps: int  # steps profiled
    kernels_per_step: float | None  # device kernels launched per step (memcpy and memset not counted); None on CPU
    device_ms_per_step: float | None  # their summed device time per step; None on CPU
    host_ms_per_step: float | None  # host wall time per step until its launch returned (None: not measured)
    top_kernels: list[dict[str, Any]] = field(default_factory=list)  # by device time: name, per step count and µs


TOP_KERNELS = 15


def _ranked(charged: Iterable[tuple[str, float]], steps: int) -> list[dict[str, Any]]:
    """The TOP_KERNELS names with the most µs charged: name, calls per step and µs per step."""
    by_name: dict[str, list[float]] = {}
    for name, us in charged:
        by_name.setdefault(name[:120], []).append(us)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:TOP_KERNELS]
    return [{"name": n, "per_step": len(t) / steps, "us_per_step": sum(t) / steps} for n, t in ranked]


def _top_kernels(kernels: list[Any], steps: int) -> list[dict[str, Any]]:
    return _ranked(((e.name, e.time_range.elapsed_us()) for e in kernels), steps)


def _charges(spans: Iterable[tuple[str, float, float]]) -> list[tuple[str, float]]:
    """Each (name, start µs, end µs), in start order, charged its end minus the latest end before it (none below
    zero): time it overlaps the kernel before (programmatic dependent launch) counts once, and an idle gap before it
    (a launch's latency) counts to it, so the charges sum to the span from the first start to the last end."""
    charged: list[tuple[str, float]] = []
    last = None
    for name, start, end in sorted(spans, key=lambda span: span[1]):
        charged.append((name[:120], end - start if last is None else max(0.0, end - last)))
        last = end if last is None else max(last, end)
    return charged


def critical_path(spans: Iterable[tuple[str, float, float]], steps: int) -> list[dict[str, Any]]:
    """Kernels ranked by the device wall time they add (_charges)."""
    return _ranked(_charges(spans), steps)


def layer_critical_path(spans: Iterable[tuple[str, float, float]], steps: int, layers: int) -> list[dict[str, Any]]:
    """One decoder layer's kernels in launch order, each with the µs it adds (_charges) averaged over the layers of
    every step but the first and last of them (whose neighbours are the embedding and the LM head): the layer is the
    longest run of kernel names repeated `layers` times back to back in a step (or `layers` - 1 or - 2 times, where the
    outer layers launch other kernels). Empty if no such run is found."""
    charged = _charges(spans)
    per_step = len(charged) // steps
    names = [name for name, _ in charged[:per_step]]
    for repeats in range(layers, max(0, layers - 3), -1):
        for length in range(per_step // max(repeats, 1), 0, -1):
            starts = [
                first for first in range(per_step - repeats * length + 1)
                if all(names[first + r * length : first + (r + 1) * length] == names[first : first + length]
                       for r in range(1, repeats))
            ]
            if starts:
                # Of the run's rotations, the one led by the step's first kernel of the run's kinds.
                kinds = set(names[starts[0] : starts[0] + length])
                lead = next(name for name in names if name in kinds)
                first = next((f for f in starts if names[f] == lead), starts[0])
                inner = range(1, repeats - 1) if repeats > 2 else range(repeats)
                return [
                    {"name": names[first + j], "us": sum(
                        charged[step * per_step + first + r * length + j][1] for step in range(steps) for r in inner
                    ) / (steps * len(inner))}
                    for j in range(length)
                ]
    return []


def profile_steps(step: Callable[[], object], device: torch.device, steps: int) -> tuple[StepProfile, Any]:
    """Runs step() `steps` times under torch.profiler (device drained after): the kernel counts and device time per
    step, and the profiler (for its tables and trace)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        synchronize(device)
    kernels = [
        e for e in prof.events()
        if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
    ]
    count = len(kernels) / steps if cuda else None
    device_ms = sum(e.time_range.elapsed_us() for e in kernels) / 1e3 / steps if cuda else None
    return StepProfile(steps, count, device_ms, None, _top_kernels(kernels, steps)), prof


def captured_graph(engine: Engine, bs: int, mode: str) -> torch.cuda.CUDAGraph | None:
    """The graph captured for bs in `mode`, if the engine has one on a CUDA stream."""
    graph = engine.graph_runner.graphs.get(mode, {}).get(bs)
    return graph if isinstance(engine.device.stream, torch.cuda.Stream) else None


def graph_device_ms(engine: Engine, bs: int, mode: str = "greedy", reps: int = 50) -> float | None:
    """Wall time on the device of the graph captured for bs in `mode`, replayed back to back with the inputs it
    holds (None without that graph): under programmatic dependent launch the kernels' own durations overlap, and
    this is the step's device time."""
    graph = captured_graph(engine, bs, mode)
    if graph is None:
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(engine.device.stream):
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
    end.synchronize()
    return start.elapsed_time(end) / reps


def graph_critical_path(
    engine: Engine, bs: int, mode: str = "greedy", reps: int = 10
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """critical_path and layer_critical_path of the graph captured for bs in `mode`, replayed back to back under
    torch.profiler (empty without that graph): where the step's device time goes when kernels overlap."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    graph = captured_graph(engine, bs, mode)
    if graph is None:
        return [], []
    with torch.cuda.stream(engine.device.stream), profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()
    spans = [(e.name, e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]
    return critical_path(spans, reps), layer_critical_path(spans, reps, engine.model_config.num_layers)


# ---- samplers -----------------------------------------------------------------------------------------------------
# No seeded row: a batch with one keeps the torch path even where FlashInfer is on (see engine/sample.py). Every
# filter in the first row, greedy last, so a batch of one samples through each of them.
MIXED_PARAMS = (
    SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    SamplingParams(temperature=0.7, top_k=50),
    SamplingParams(temperature=1.0, top_p=0.9),
    SamplingParams(temperature=1.2, min_p=0.1),
    SamplingParams(temperature=0.6, top_k=20, top_p=0.8),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.9, top_k=100, top_p=0.95),
    SamplingParams(),  # greedy
)


def mixed_batch(bs: int) -> Batch:
    reqs = [
        Req(torch.tensor([1, 2, 3], dtype=torch.int32), i, 0, 1, i, MIXED_PARAMS[i % len(MIXED_PARAMS)])
        for i in range(bs)
    ]
    for req in reqs:
        req.cached_len = req.device_len - 1
    return Batch(reqs, "decode")


def make_sampler(impl: str, device: torch.device, vocab: int) -> Sampler | None:
    """The engine's sampler on its torch or its FlashInfer path; None when that path cannot run here."""
    if impl == "flashinfer" and (device.type != "cuda" or not flashinfer_installed()):
        return None
    if "use_flashinfer" not in inspect.signature(Sampler).parameters:
        return Sampler(device, vocab, seed=0) if impl == "torch" else None
    return Sampler(device, vocab, seed=0, use_flashinfer=impl == "flashinfer")
