"""Side-by-side ratios in one process and one run: this engine against HF generate, and against the hardware.

    python -m benchmarks.compare [--device cpu|cuda] [--quick] [--json PATH] [--sections grid,roofline,offline]

1. Controlled grid: B requests with the same random prompts, greedy, EOS ignored, n new tokens each, through
   this engine (eager, and with CUDA graphs on GPU), HF generate eager (DynamicCache) and HF generate with a
   static cache + torch.compile (GPU). Reports output tokens/s (B * n / wall time of the whole call, prefill
   included) and ms per decode step.
   ms per decode step = (T(n) - T(1)) / (n - 1), where T(k) is the wall time of a whole call that makes k tokens:
   both calls run the same prefill and first sample, so the difference is n - 1 decode steps, with every per-step
   overhead (scheduling, sampling, cache updates) included and no hook inside the loop to perturb it. The same
   method is applied to every contender. Repeats run interleaved (each contender once per round), and each ratio
   is the median over rounds of the ratio within a round, so load from other processes hits both sides alike.
2. Roofline (GPU): device bandwidth from a large device-to-device copy (read + write bytes), in the same run.
   floor = (weight bytes read + KV bytes read) / bandwidth per decode step; reports step / floor per B.
3. Offline workload (GPU), shaped like nano-vllm's bench: 256 requests, random token ids, input and output
   lengths U(100, 1024), EOS ignored, seed 0, through the static driver with a prefill token budget. Reports
   total output tokens/s.

HF static+compile runs in a persistent child process of its own (--isolate NAMES picks which HF contenders do):
once its compiled CUDA graph trees had run in this process, the engine's next B=64 call on an H200 died with an
illegal memory access, which the engine alone never did. The child times each call itself, as timed_both does,
and the rounds stay interleaved across the two processes.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import multiprocessing
import os
import platform
import shlex
import statistics
import subprocess
import sys
import traceback
from collections.abc import Callable
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from engine import Engine, SamplingParams
from engine.driver import StaticDriver
from oracle.hf import greedy_generation_config

from .common import (
    ModelChoice,
    build_engine,
    graphs,
    graphs_captured,
    model_for,
    random_prompts,
    synchronize,
    timed,
    timed_both,
)

ENGINE_EAGER = "engine eager"
ENGINE_GRAPHS = "engine cuda-graphs"
HF_EAGER = "hf eager"
HF_STATIC = "hf static+compile"


@dataclass(frozen=True)
class Plan:
    batch_sizes: tuple[int, ...]
    prompt_len: int
    new_tokens: int
    repeats: int
    offline_requests: int
    prefill_budget: int

    @staticmethod
    def for_device(device: torch.device, quick: bool) -> Plan:
        if device.type == "cuda":
            if quick:
                return Plan((1, 64), 512, 32, 1, 32, 16384)
            return Plan((1, 8, 64, 256), 512, 256, 3, 256, 16384)
        if quick:
            return Plan((1, 8), 64, 8, 1, 0, 0)
        return Plan((1, 8), 64, 32, 5, 0, 0)


Prompts = list[list[int]]
Generate = Callable[[Prompts, int], Prompts]  # (prompts, n) -> the n new tokens of each prompt
Timed = tuple[float, float, Prompts]  # wall seconds, process-CPU seconds, new tokens of one call


@dataclass
class Contender:
    name: str
    run: Callable[[Prompts, int], Timed]  # one call, timed (device drained before and after) where it runs
    # Per round: wall and process-CPU seconds of a call making n tokens, and of one making 1 token.
    t_n: list[float] = field(default_factory=list)
    t_1: list[float] = field(default_factory=list)
    c_n: list[float] = field(default_factory=list)
    c_1: list[float] = field(default_factory=list)

    def measure(self, prompts: Prompts, n: int) -> None:
        for k, wall, cpu in ((n, self.t_n, self.c_n), (1, self.t_1, self.c_1)):
            w, c, _ = self.run(prompts, k)
            wall.append(w)
            cpu.append(c)


def timed_generate(
    generate: Generate, device: torch.device, release_cache: bool = False
) -> Callable[[Prompts, int], Timed]:
    def run(prompts: Prompts, n: int) -> Timed:
        out: Prompts = []
        wall, cpu = timed_both(lambda: out.extend(generate(prompts, n)), device)
        if release_cache and device.type == "cuda":
            # Untimed: give cached blocks back, so a peak here (HF eager's prefill logits at B=256 held ~100 GB)
            # does not starve the child process of the isolated contender.
            torch.cuda.empty_cache()
        return wall, cpu, out

    return run


@dataclass
class GridRow:
    batch: int
    method: str
    tokens_per_s: float  # medians over rounds
    ms_per_step: float
    cpu_ms_per_step: float  # process CPU time per step: steadier than wall time on a shared CPU
    t_n_s: list[float]
    t_1_s: list[float]
    cpu_n_s: list[float]
    cpu_1_s: list[float]


# ---- contenders ---------------------------------------------------------------------------------------------------
def engine_contender(engine: Engine, name: str, use_graphs: bool) -> Contender:
    driver = StaticDriver(engine)  # reused across calls: finished requests give their rows and pages back

    def generate(prompts: Prompts, n: int) -> Prompts:
        with graphs(engine, use_graphs):
            gens = driver.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))
        return [g.output_ids for g in gens]

    return Contender(name, timed_generate(generate, engine.device.torch_device))


def load_hf(choice: ModelChoice, device: torch.device) -> Any:
    """HF's model for the same dir: its weights, or (dummy) a random init of the same shape and dtype."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    kwargs: dict[str, Any] = {"dtype": choice.dtype, "attn_implementation": "sdpa"}
    model: Any
    if choice.dummy:
        with device:
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(choice.path), **kwargs)
    else:
        model = AutoModelForCausalLM.from_pretrained(choice.path, **kwargs)
        model = model.to(device)
    # generate() fills every unset field of the passed config from model.generation_config, EOS included; an
    # empty one leaves EOS unset, so every row runs all n steps.
    model.generation_config = GenerationConfig(pad_token_id=0)
    return model.eval()


def hf_generate(model: Any, static_cache_len: int | None) -> Generate:
    device = model.device

    def config(n: int) -> Any:
        return greedy_generation_config(n, static_cache_len)

    prepared, _ = model._prepare_generation_config(config(2))
    if prepared.eos_token_id is not None:
        raise RuntimeError(f"HF generate would stop at EOS {prepared.eos_token_id}; the grid needs exactly n tokens")

    def generate(prompts: Prompts, n: int) -> Prompts:
        ids = torch.tensor(prompts, dtype=torch.long, device=device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config(n))
        if out.shape[1] != ids.shape[1] + n:
            raise RuntimeError(f"HF generate made {out.shape[1] - ids.shape[1]} tokens, not {n}")
        return out[:, ids.shape[1] :].tolist()

    return generate


class IsolatedHF:
    """One HF contender in a persistent child process, served over a pipe: (prompts, n) -> Timed, timed there.

    "spawn" so the child starts with a fresh CUDA context and nothing compiled: the point is that whatever
    torch.compile's CUDA graph trees do to a process's CUDA state stays in the child.
    """

    def __init__(self, choice: ModelChoice, device: torch.device, name: str, static_cache_len: int | None) -> None:
        self.name = name
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        # This process's thread count (the engine's choice, while it lives): CPU contenders get the same cores.
        args = (child_conn, choice, device, static_cache_len, torch.get_num_threads())
        self.proc = ctx.Process(target=serve_hf, args=args, name=f"compare: {name}", daemon=True)
        self.proc.start()
        child_conn.close()  # only the child holds its end now, so its death reads as EOF here
        try:
            self._receive()  # the model is loaded (or loading failed)
        except BaseException:
            self.close()
            raise

    def run(self, prompts: Prompts, n: int) -> Timed:
        with suppress(OSError):  # the child is gone; _receive says why
            self.conn.send((prompts, n))
        result: Timed = self._receive()
        return result

    def _receive(self) -> Any:
        try:
            status, payload = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(timeout=10)
            raise RuntimeError(f"{self.name}: its child process died (exit code {self.proc.exitcode})") from None
        if status == "error":
            raise RuntimeError(f"{self.name}: its child process failed:\n{payload}")
        return payload

    def close(self) -> None:
        with suppress(OSError):
            self.conn.send(None)
        self.proc.join(timeout=15)
        if self.proc.is_alive():
            self.proc.terminate()
            self.proc.join()
        self.conn.close()

    def __enter__(self) -> IsolatedHF:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_hf(
    conn: Connection, choice: ModelChoice, device: torch.device, static_cache_len: int | None, threads: int
) -> None:
    """The child's loop: load as load_hf does, then answer each (prompts, n) with Timed until None arrives.

    Any exception goes back as its traceback text and ends the child: after a CUDA error its context is unusable.
    """
    try:
        torch.set_num_threads(threads)
        generate = hf_generate(load_hf(choice, device), static_cache_len)
        run = timed_generate(generate, device)
        conn.send(("ok", None))
        while (request := conn.recv()) is not None:
            conn.send(("ok", run(*request)))
    except Exception:
        with suppress(OSError):  # the parent may be gone already
            conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


# ---- 1. controlled grid -------------------------------------------------------------------------------------------
def run_grid(
    choice: ModelChoice,
    device: torch.device,
    plan: Plan,
    log: Callable[[str], None],
    isolate: frozenset[str] = frozenset({HF_STATIC}),
    skip: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The grid; the HF contenders named in `isolate` run in child processes (IsolatedHF), the rest here, and the
    contenders named in `skip` not at all."""
    cuda = device.type == "cuda"
    max_b, n = max(plan.batch_sizes), plan.new_tokens
    engine = build_engine(
        choice,
        device,
        max_running_req=max_b,
        kv_tokens=max_b * (plan.prompt_len + n + 1),
        cuda_graph_bs=sorted(plan.batch_sizes) if cuda else None,
        max_seq_len=plan.prompt_len + n + 1,
    )
    vocab = engine.model_config.vocab_size
    contenders = [] if ENGINE_EAGER in skip else [engine_contender(engine, ENGINE_EAGER, use_graphs=False)]
    if graphs_captured(engine):
        if ENGINE_GRAPHS not in skip:
            contenders.append(engine_contender(engine, ENGINE_GRAPHS, use_graphs=True))
    elif cuda:
        log("engine: no CUDA graphs were captured; the cuda-graphs row is left out")
    hf_all: list[tuple[str, int | None]] = [(HF_EAGER, None)] + ([(HF_STATIC, plan.prompt_len + n)] if cuda else [])
    hf_plan = [(name, cache_len) for name, cache_len in hf_all if name not in skip]
    hf = None
    if any(name not in isolate for name, _ in hf_plan):
        hf = load_hf(choice, device)
    rows: list[GridRow] = []
    agreement: dict[str, dict[int, float]] = {}
    with ExitStack() as children:  # closes every child, also when a call raises
        for name, static_cache_len in hf_plan:
            if name in isolate:
                child = children.enter_context(IsolatedHF(choice, device, name, static_cache_len))
                log(f"{name}: runs in child process {child.proc.pid}")
                contenders.append(Contender(name, child.run))
            else:
                run_hf = timed_generate(hf_generate(hf, static_cache_len), device, release_cache=True)
                contenders.append(Contender(name, run_hf))
        for b in plan.batch_sizes:
            prompts = random_prompts(b, plan.prompt_len, vocab, seed=b)
            outputs: dict[str, Prompts] = {}
            for c in contenders:  # warm-up: compiles, captures, allocator growth; the static compile needs both shapes
                for times in (c.t_n, c.t_1, c.c_n, c.c_1):
                    times.clear()
                outputs[c.name] = c.run(prompts, n)[2]
                c.run(prompts, 1)
            for r in range(plan.repeats):
                for c in contenders:
                    c.measure(prompts, n)
                walls = ", ".join(f"{c.name} {c.t_n[-1]:.3f}s (1 token: {c.t_1[-1]:.3f}s)" for c in contenders)
                log(f"B={b} round {r + 1}/{plan.repeats}: {walls}")
            for c in contenders:
                rows.append(
                    GridRow(
                        b,
                        c.name,
                        statistics.median(b * n / t for t in c.t_n),
                        statistics.median(step_ms(tn, t1, n) for tn, t1 in zip(c.t_n, c.t_1)),
                        statistics.median(step_ms(tn, t1, n) for tn, t1 in zip(c.c_n, c.c_1)),
                        list(c.t_n),
                        list(c.t_1),
                        list(c.c_n),
                        list(c.c_1),
                    )
                )
            # Checks that the contenders computed the same thing: greedy tokens of HF and the engine (only with the
            # same real weights; near-ties in the logits may differ), and of graph replay against eager.
            checks = [(ENGINE_GRAPHS, ENGINE_EAGER)] + ([] if choice.dummy else [(ENGINE_EAGER, HF_EAGER)])
            for a, ref in checks:
                if a in outputs and ref in outputs:
                    agreement.setdefault(f"{a} = {ref}", {})[b] = same_tokens(outputs[a], outputs[ref])
    ratios = grid_ratios(contenders_by_batch(rows), n)
    engine_info = {
        "weight_bytes_read": weight_bytes_read(engine),
        "kv_bytes_per_token": kv_bytes_per_token(engine),
        "graphs_captured": graphs_captured(engine),
        "attention_backend": engine.attn_backend.name,
    }
    engine.shutdown()
    del hf, contenders
    if cuda:  # hand the memory on to the offline run: compiled graphs and their pools hold some of it
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
    return {
        "rows": [asdict(r) for r in rows],
        "ratios": ratios,
        "greedy_agreement": agreement,
        "engine": engine_info,
        "isolated": [name for name, _ in hf_plan if name in isolate],
    }


def same_tokens(a: list[list[int]], b: list[list[int]]) -> float:
    """Share of positions where two runs produced the same token."""
    pairs = [(x, y) for ra, rb in zip(a, b) for x, y in zip(ra, rb)]
    return sum(x == y for x, y in pairs) / len(pairs)


def step_ms(t_n: float, t_1: float, n: int) -> float:
    return (t_n - t_1) / (n - 1) * 1e3


def contenders_by_batch(rows: list[GridRow]) -> dict[int, dict[str, GridRow]]:
    out: dict[int, dict[str, GridRow]] = {}
    for r in rows:
        out.setdefault(r.batch, {})[r.method] = r
    return out


def grid_ratios(by_batch: dict[int, dict[str, GridRow]], n: int) -> list[dict[str, Any]]:
    """Per B and pair: tokens/s ratio (a over b) and ms/step ratio (a over b), medians of per-round ratios."""
    pairs = [
        (ENGINE_EAGER, HF_EAGER),
        (ENGINE_GRAPHS, HF_EAGER),
        (ENGINE_GRAPHS, HF_STATIC),
        (ENGINE_EAGER, HF_STATIC),
        (ENGINE_GRAPHS, ENGINE_EAGER),
    ]
    out = []
    for b, rows in by_batch.items():
        for a, ref in pairs:
            if a not in rows or ref not in rows:
                continue
            ra, rb = rows[a], rows[ref]
            out.append(
                {
                    "batch": b,
                    "a": a,
                    "b": ref,
                    "tokens_per_s_ratio": statistics.median(tb / ta for ta, tb in zip(ra.t_n_s, rb.t_n_s)),
                    "step_time_ratio": paired_step_ratio(ra.t_n_s, ra.t_1_s, rb.t_n_s, rb.t_1_s, n),
                    "cpu_step_time_ratio": paired_step_ratio(ra.cpu_n_s, ra.cpu_1_s, rb.cpu_n_s, rb.cpu_1_s, n),
                }
            )
    return out


def paired_step_ratio(a_n: list[float], a_1: list[float], b_n: list[float], b_1: list[float], n: int) -> float:
    """Median over rounds of (a's ms/step) / (b's ms/step) within the round."""
    return statistics.median(
        step_ms(an, a1, n) / step_ms(bn, b1, n) for an, a1, bn, b1 in zip(a_n, a_1, b_n, b_1)
    )


# ---- 2. roofline --------------------------------------------------------------------------------------------------
def weight_bytes_read(engine: Engine) -> int:
    """Bytes of weights one decode step reads: all of them, except an untied embedding (it reads B rows)."""
    total = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    if not engine.model_config.tie_word_embeddings:
        emb = engine.model.model.embed_tokens.weight
        total -= emb.numel() * emb.element_size()
    return total


def kv_bytes_per_token(engine: Engine) -> int:
    cfg = engine.model_config
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * engine.kv_cache.buffer.element_size()


def measure_bandwidth(device: torch.device, nbytes: int = 2 * 1024**3, reps: int = 20) -> float:
    """Bytes/s of a device-to-device copy, counting the read and the write; best of 5 trials."""
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = 0.0
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            dst.copy_(src)
        end.record()
        end.synchronize()
        best = max(best, 2 * src.numel() * reps / (start.elapsed_time(end) / 1e3))
    del src, dst
    torch.cuda.empty_cache()
    return best


def run_roofline(grid: dict[str, Any], plan: Plan, bandwidth: float) -> list[dict[str, Any]]:
    info = grid["engine"]
    # Decode step s (1 ≤ s < n) attends over prompt + s tokens; the grid's ms/step averages over those steps.
    mean_ctx = plan.prompt_len + plan.new_tokens / 2
    by_batch = contenders_by_batch([GridRow(**r) for r in grid["rows"]])
    out = []
    for b, rows in by_batch.items():
        best = rows.get(ENGINE_GRAPHS) or rows.get(ENGINE_EAGER)
        if best is None:  # both engine contenders were skipped
            continue
        kv = b * mean_ctx * info["kv_bytes_per_token"]
        floor_ms = (info["weight_bytes_read"] + kv) / bandwidth * 1e3
        out.append(
            {
                "batch": b,
                "method": best.method,
                "step_ms": best.ms_per_step,
                "floor_ms": floor_ms,
                "weight_bytes": info["weight_bytes_read"],
                "kv_bytes": kv,
                "step_over_floor": best.ms_per_step / floor_ms,
            }
        )
    return out


# ---- 3. offline workload ------------------------------------------------------------------------------------------
def run_offline(choice: ModelChoice, device: torch.device, plan: Plan, log: Callable[[str], None]) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    count = plan.offline_requests
    in_lens = torch.randint(100, 1025, (count,), generator=gen).tolist()
    out_lens = torch.randint(100, 1025, (count,), generator=gen).tolist()
    engine = build_engine(choice, device, max_running_req=count, kv_tokens=None, max_seq_len=2048 + 1)
    vocab = engine.model_config.vocab_size
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in in_lens]
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in out_lens]
    driver = StaticDriver(engine, max_prefill_tokens=plan.prefill_budget)
    warm = random_prompts(min(count, 16), 128, vocab, seed=1)  # JIT, graph pools, allocator growth
    driver.generate(warm, SamplingParams(max_tokens=16, ignore_eos=True))
    results: list[Any] = []
    seconds = timed(lambda: results.extend(driver.generate(prompts, params)), device)
    produced = sum(len(g.output_ids) for g in results)
    if produced != sum(out_lens):
        raise RuntimeError(f"the offline run produced {produced} tokens, expected {sum(out_lens)}")
    log(f"offline: {count} requests, {produced} output tokens in {seconds:.2f}s")
    out = {
        "requests": count,
        "input_tokens": sum(in_lens),
        "output_tokens": produced,
        "seconds": seconds,
        "output_tokens_per_s": produced / seconds,
        "prefill_budget": plan.prefill_budget,
        "graphs_captured": graphs_captured(engine),
    }
    engine.shutdown()
    return out


# ---- report -------------------------------------------------------------------------------------------------------
def machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {torch.get_num_threads()} torch threads"


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True)
    except OSError:
        return "unknown"
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def print_report(result: dict[str, Any]) -> None:
    """One table: grid rows, then ratios (a / b: tokens/s ratio, ms/step ratio), roofline and offline rows."""
    from rich.console import Console
    from rich.table import Table

    meta = result["meta"]
    title = f"{meta['model']} {meta['dtype']} on {meta['machine']} · commit {meta['commit']} · {meta['date']}"
    table = Table(title=title)
    table.add_column("section")
    table.add_column("B", justify="right")
    table.add_column("what")
    for col in ("tokens/s", "ms/step", "CPU ms/step", "note"):
        table.add_column(col, justify="right")
    grid = result.get("grid")
    on_cpu = meta["device"] == "cpu"  # host CPU time says nothing about GPU work
    if grid:
        for r in grid["rows"]:
            table.add_row(
                "grid", str(r["batch"]), r["method"], f"{r['tokens_per_s']:.1f}", f"{r['ms_per_step']:.3f}",
                f"{r['cpu_ms_per_step']:.3f}" if on_cpu else "", "",
            )
        for q in grid["ratios"]:
            table.add_row(
                "ratio", str(q["batch"]), f"{q['a']} / {q['b']}", f"{q['tokens_per_s_ratio']:.2f}x",
                f"{q['step_time_ratio']:.2f}x", f"{q['cpu_step_time_ratio']:.2f}x" if on_cpu else "",
                "median of per-round ratios",
            )
        for pair, by_b in grid["greedy_agreement"].items():
            for b, frac in by_b.items():
                table.add_row("check", str(b), f"greedy tokens: {pair}", "", "", "", f"{frac:.1%}")
    if "bandwidth_bytes_per_s" in result:
        bw = result["bandwidth_bytes_per_s"] / 1e12
        table.add_row("roofline", "", "D2D copy bandwidth (read + write)", "", "", "", f"{bw:.2f} TB/s")
        for r in result["roofline"]:
            table.add_row(
                "roofline", str(r["batch"]), f"{r['method']}: step / floor", "",
                f"{r['step_ms']:.3f} / {r['floor_ms']:.3f}", "", f"{r['step_over_floor']:.2f}x",
            )
    off = result.get("offline")
    if off:
        table.add_row(
            "offline", str(off["requests"]), "output tokens/s (whole run)", f"{off['output_tokens_per_s']:.0f}", "", "",
            f"{off['output_tokens']} tokens in {off['seconds']:.1f}s",
        )
    Console(width=200).print(table)


def name_set(text: str) -> frozenset[str]:
    """A comma list of contender names ("" for none)."""
    return frozenset(name.strip() for name in text.split(",") if name.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, tokens and rounds (a smoke run)")
    parser.add_argument("--json", type=Path, help="write the full results here")
    parser.add_argument("--model", help="model dir (default: Qwen3-0.6B shape on GPU, SmolLM2-135M on CPU)")
    parser.add_argument("--shape", default="qwen3-0.6b", help="GPU shape under benchmarks/configs/ (dummy weights)")
    parser.add_argument("--batch-sizes", type=lambda s: tuple(int(x) for x in s.split(",")), help="e.g. 1,8")
    parser.add_argument("--repeats", type=int, help="interleaved rounds per batch size")
    parser.add_argument("--sections", default="grid,roofline,offline", help="comma list of grid,roofline,offline")
    parser.add_argument(
        "--isolate",
        metavar="NAMES",
        default=HF_STATIC,
        type=name_set,
        help=f'comma list of HF contenders ("{HF_EAGER}", "{HF_STATIC}") to run in a child process each '
        f'(default "{HF_STATIC}"; "" for none)',
    )
    parser.add_argument(
        "--skip",
        metavar="NAMES",
        default=frozenset(),
        type=name_set,
        help="comma list of contenders to leave out of the grid, e.g. to fit a time limit",
    )
    args = parser.parse_args(argv)
    if not args.skip <= {ENGINE_EAGER, ENGINE_GRAPHS, HF_EAGER, HF_STATIC}:
        names = ", ".join(repr(n) for n in (ENGINE_EAGER, ENGINE_GRAPHS, HF_EAGER, HF_STATIC))
        parser.error(f"--skip takes only {names}, not {sorted(args.skip)}")
    if not args.isolate <= {HF_EAGER, HF_STATIC}:
        parser.error(f"--isolate takes only {HF_EAGER!r} and {HF_STATIC!r}, not {sorted(args.isolate)}")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but no CUDA GPU is visible")
    plan = Plan.for_device(device, args.quick)
    if args.batch_sizes:
        plan = replace(plan, batch_sizes=args.batch_sizes)
    if args.repeats:
        plan = replace(plan, repeats=args.repeats)
    sections = set(args.sections.split(","))
    choice = model_for(device, args.model, args.shape)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    result: dict[str, Any] = {
        "meta": {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": git_commit(),
            "device": device.type,
            "machine": machine(device),
            "model": choice.label,
            "dtype": str(choice.dtype).removeprefix("torch."),
            "torch": torch.__version__,
            "transformers": __import__("transformers").__version__,
            "command": shlex.join([Path(sys.executable).name, "-m", "benchmarks.compare", *(argv or sys.argv[1:])]),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "plan": asdict(plan),
        }
    }

    def save() -> None:  # after every section: a run cut short by a time limit keeps what it finished
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=2, default=str))

    roofline = device.type == "cuda" and "roofline" in sections
    if roofline:  # first, so that a run cut short by a time limit still has it
        result["bandwidth_bytes_per_s"] = measure_bandwidth(device)
        log(f"bandwidth {result['bandwidth_bytes_per_s'] / 1e12:.3f} TB/s")
        save()
    if "grid" in sections or "roofline" in sections:
        grid = run_grid(choice, device, plan, log, args.isolate, args.skip)
        result["meta"]["skipped"] = sorted(args.skip)
        result["meta"]["isolated"] = grid.pop("isolated")  # the contenders that ran in a child process
        result["grid"] = grid
        save()
    if roofline:
        result["roofline"] = run_roofline(result["grid"], plan, result["bandwidth_bytes_per_s"])
        save()
    if device.type == "cuda" and "offline" in sections and plan.offline_requests:
        result["offline"] = run_offline(choice, device, plan, log)
        save()
    synchronize(device)
    print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
