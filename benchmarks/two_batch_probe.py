"""Would a large decode batch run faster as parts side by side on one GPU? Each part is an engine of the cuda-bf16
target (the benchmark model's shape, dummy weights; its own weights, KV pool, CUDA stream and greedy graph) decoding
B / parts requests at the context; their graphs replay concurrently on their streams, joined after every step, against
one engine of B. At B 64 and 256 the step is FlashInfer's decode (memory-bound) beside the cuBLAS products and the
small norm and SiLU kernels (latency-bound at these rows): if parts overlap them, a split decode step is worth
building; if they only queue, it is not.

    python -m benchmarks.two_batch_probe [--batch-sizes 64,256] [--parts 2] [--context 640] [--rounds 2] [--json PATH]

Device ms a step, from back-to-back replays: the whole batch; one part alone; the parts one after the other; the
parts side by side, joined after each step (what a step of the split engine would take) and free-running (the bound).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import DecodeStep, benchmark_target, build_engine, captured_graph, model_for, write_record
from engine import Engine

REPS = 50


def decode_engine(bs: int, context: int, seed: int) -> Engine:
    """An engine of bs rows whose greedy graph of bs rows holds a decode at `context` (DecodeStep's)."""
    target = benchmark_target("cuda-bf16", "cuda")
    engine = build_engine(target, model_for(target), max_running_req=bs, kv_tokens=bs * (context + 2), graph_bs=[bs],
                          max_seq_len=context + 2)
    step = DecodeStep(engine, bs, context, seed=seed)
    for _ in range(3):
        step.step()
    return engine


def replay_ms(engines: list[Engine], bs: int, together: bool, joined: bool = True) -> float:
    """Device ms a step of the engines' greedy graphs of bs rows: all on their own streams at once (`together`,
    each step `joined` or not), else one after another on the first engine's stream."""
    graphs = [captured_graph(e, bs, "greedy") for e in engines]
    streams = [e.device.stream for e in engines] if together else [engines[0].device.stream] * len(engines)
    assert all(isinstance(s, torch.cuda.Stream) for s in streams) and all(g is not None for g in graphs)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first = streams[0]
    start.record(first)
    for stream in streams[1:]:
        stream.wait_event(start)
    for _ in range(REPS):
        for graph, stream in zip(graphs, streams):
            with torch.cuda.stream(stream):
                graph.replay()
        if joined and together:
            done = [stream.record_event() for stream in streams]
            for stream in streams:
                for event in done:
                    stream.wait_event(event)
    for stream in streams[1:]:
        first.wait_stream(stream)
    end.record(first)
    end.synchronize()
    return start.elapsed_time(end) / REPS


def probe(bs: int, parts: int, context: int) -> dict[str, float]:
    """One round of the rows for B = bs split in `parts`."""
    rows: dict[str, float] = {}
    whole = decode_engine(bs, context, seed=bs)
    rows["whole batch"] = replay_ms([whole], bs, together=False)
    whole.shutdown()
    del whole
    torch.cuda.empty_cache()
    size = bs // parts
    engines = [decode_engine(size, context, seed=bs + i) for i in range(parts)]
    rows["one part alone"] = replay_ms(engines[:1], size, together=False)
    rows["parts one after the other"] = replay_ms(engines, size, together=False)
    rows["parts side by side, joined each step"] = replay_ms(engines, size, together=True)
    rows["parts side by side, free-running"] = replay_ms(engines, size, together=True, joined=False)
    for engine in engines:
        engine.shutdown()
    del engines
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="64,256")
    parser.add_argument("--parts", default="2", help="comma-separated: how many engines share each batch")
    parser.add_argument("--context", type=int, default=640)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    results: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for bs in (int(v) for v in args.batch_sizes.split(",")):
            for parts in (int(v) for v in args.parts.split(",")):
                if bs % parts:
                    parser.error(f"B {bs} does not split into {parts} equal parts")
                rows = probe(bs, parts, args.context)
                for name, ms in rows.items():
                    print(f"round {round_} B {bs} / {parts}: {name}: {ms:.4f} ms", flush=True)
                results.append({"round": round_, "bs": bs, "parts": parts, "context": args.context, "ms": rows})
    if args.json:
        write_record(args.json, "benchmarks.two_batch_probe", results)


if __name__ == "__main__":
    main()
