"""Where a decode step's time goes: host time of each engine part, the device time of a bare graph replay, and
(optionally) a torch.profiler trace.

    python -m benchmarks.profile_step [--device cuda] [--target T] [--batch-sizes 1,64] [--context 512] [--steps 100]
                                      [--trace DIR] [--set attention_backend=triton ...]

Each batch size runs `--steps` decode steps of the static driver on the benchmark model (the Qwen3-0.6B shape on
GPU, SmolLM2-135M on CPU) of the target (--target, else cpu-fp32 on CPU and cuda-bf16 on CUDA) after a warm-up.
Phase times are host wall time spent inside each part, per step; parts nest (forward_batch includes the graph
replay, which includes the FlashInfer plan). The phases are timed over the overlapped run (StaticDriver.run), where
the driver waits for a step's tokens only after starting the next one; waited_step_ms is the latency of a step that
is waited for at once (step()).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import engine.engine as engine_module
from engine import Engine, SamplingParams
from engine.driver import StaticDriver
from oracle.environment import git_commit
from oracle.target import TargetError

from .common import (
    benchmark_target,
    build_engine,
    command_line,
    graph_device_ms,
    machine_info,
    model_for,
    profile_steps,
    random_prompts,
    synchronize,
)


@contextmanager
def phase_timers(targets: list[tuple[object, str, str]]) -> Iterator[dict[str, float]]:
    """Wrap each (owner, attribute, label) callable to add its host wall time to totals[label]; restore after."""
    totals: dict[str, float] = defaultdict(float)
    saved = []  # (owner, attr, what its own __dict__ held, or None when the attribute came from its class)
    for owner, attr, label in targets:
        original = getattr(owner, attr)
        saved.append((owner, attr, vars(owner).get(attr)))

        def timed(*args: Any, _f: Callable[..., Any] = original, _label: str = label, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return _f(*args, **kwargs)
            finally:
                totals[_label] += time.perf_counter() - start

        setattr(owner, attr, timed)
    try:
        yield totals
    finally:
        for owner, attr, own in saved:
            if own is None:
                delattr(owner, attr)  # the wrapper shadowed a method of the owner's class
            else:
                setattr(owner, attr, own)


def profile_batch(engine: Engine, bs: int, context: int, steps: int, trace: Path | None) -> dict[str, Any]:
    driver = StaticDriver(engine)
    for prompt in random_prompts(bs, context, engine.model_config.vocab_size, seed=bs):
        driver.add(prompt, SamplingParams(max_tokens=2 * steps + 25, ignore_eos=True))
    for _ in range(20):  # prefill, then warm-up decode steps
        driver.step()
    device = engine.device.torch_device
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):  # each step waited for: its latency
        driver.step()
    waited_s = (time.perf_counter() - start) / steps
    targets = [
        (driver.pages, "map", "driver: page-table writes"),
        (engine_module, "validate_batch", "prepare: request checks"),
        (engine_module, "pack_inputs", "prepare: packed inputs (host)"),
        (engine_module, "unpack_inputs", "prepare: inputs + slot checks (device, eager passes)"),
        (engine.attn_backend, "prepare_metadata", "prepare: attention metadata"),
        (engine.sampler, "prepare", "prepare: sampling args"),
        (engine, "forward_batch", "forward_batch"),
        (engine_module.ForwardOutput, "wait", "driver: waiting for the tokens"),
        (engine.graph_runner, "replay", "forward: graph replay incl. upload and plan"),
        (engine.attn_backend, "prepare_for_replay", "forward: attention plan"),
        (engine.sampler, "sample_deferred", "forward: sampling"),
    ]
    kernels = None
    if trace is not None:
        kernels, prof = profile_steps(driver.step, device, 5)
        trace.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace / f"decode-bs{bs}.json"))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
    synchronize(device)
    first = next(iter(driver.running.values()))
    remaining = first.req.sampling_params.max_tokens - len(first.output_ids)  # every request is as far
    with phase_timers(targets) as totals:
        start = time.perf_counter()
        driver.run()  # the remaining decode steps, overlapped
        synchronize(device)
        step_s = (time.perf_counter() - start) / remaining
    result = {
        "batch": bs,
        "step_ms": step_s * 1e3,
        "waited_step_ms": waited_s * 1e3,
        "graph_device_ms": graph_device_ms(engine, bs),
        "phases_ms": {label: t / remaining * 1e3 for label, t in totals.items()},
        "kernels": None if kernels is None else asdict(kernels),  # with --trace: kernels and device time per step
    }
    for uid in list(driver.running):
        driver.abort(uid)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), help="default: the target's, else cuda where a GPU is")
    parser.add_argument("--target", help="preset[,key=value...] or FILE.toml (default: cpu-fp32 / cuda-bf16)")
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64])
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per request")
    parser.add_argument("--steps", type=int, default=100, help="timed decode steps per batch size")
    parser.add_argument("--model", help="model dir (default: the benchmark model of the device)")
    parser.add_argument("--trace", type=Path, help="also write a torch.profiler trace of 5 steps per batch size here")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="an EngineConfig string field for the engine, e.g. attention_backend=triton (repeatable)")
    args = parser.parse_args(argv)
    bad = [item for item in args.set if "=" not in item]
    if bad:
        parser.error(f"--set {bad[0]!r}: give FIELD=VALUE")
    overrides = dict(item.split("=", 1) for item in args.set)
    try:
        target = benchmark_target(args.target, args.device)
    except TargetError as exc:
        parser.error(str(exc))
    device = target.torch_device
    choice = model_for(target, args.model)
    max_bs, max_len = max(args.batch_sizes), args.context + 2 * args.steps + 26
    try:
        engine = build_engine(
            target,
            choice,
            max_running_req=max_bs,
            kv_tokens=max_bs * max_len,
            graph_bs=sorted(args.batch_sizes),
            max_seq_len=max_len,
            **overrides,
        )
    except TypeError as exc:  # a --set field this command sets itself, or one EngineConfig does not have
        parser.error(f"--set: {exc}")
    try:
        results = [profile_batch(engine, bs, args.context, args.steps, args.trace) for bs in args.batch_sizes]
    finally:
        engine.shutdown()
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(),
        "target": target.describe(),
        "device": device.type,
        "model": choice.label,
        "engine_overrides": overrides,
        "command": command_line("benchmarks.profile_step", argv),
        "machine_info": machine_info(),
    }
    text = json.dumps({"meta": meta, "results": results}, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
