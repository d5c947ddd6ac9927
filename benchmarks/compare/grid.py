"""The controlled grid: B requests with the same random prompts through every contender, rounds interleaved,
reported as tokens/s, ms per decode step ((T(n) - T(1)) / (n - 1)) and per-round paired ratios. It also counts,
while the engine lives, the weight and KV bytes a decode step reads, for the roofline.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from itertools import product
from typing import Any

import torch

from engine import Engine
from engine.driver import StaticDriver
from oracle.target import Target

from ..common import ModelChoice, build_engine, graphs_captured, random_prompts
from .contenders import (
    ENGINE_EAGER,
    ENGINE_GRAPHS,
    HF_EAGER,
    HF_STATIC,
    Contender,
    IsolatedHF,
    Prompts,
    engine_contender,
    hf_generate,
    load_hf,
    timed_generate,
)
from .plan import Plan
from .profile import profile_row
from .sampling import GREEDY, labelled


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


def run_grid(
    target: Target,
    choice: ModelChoice,
    plan: Plan,
    log: Callable[[str], None],
    isolate: frozenset[str] = frozenset({HF_STATIC}),
    skip: frozenset[str] = frozenset(),
    modes: tuple[str, ...] = (GREEDY,),
    profile: bool = False,
    sampled_batch_sizes: frozenset[int] | None = None,
) -> dict[str, Any]:
    """The grid; the HF contenders named in `isolate` run in child processes (IsolatedHF), the rest here, and the
    contenders named in `skip` not at all. Each engine contender runs once per sampling mode, HF greedy only; with
    `profile`, each mode of the engine's fastest contender (graphs where captured) gets a step profile per B. The
    sampled modes run at the B in `sampled_batch_sizes` only (None: at every B)."""
    device = target.torch_device
    cuda = device.type == "cuda"
    max_b, n = max(plan.batch_sizes), plan.new_tokens
    engine = build_engine(
        target,
        choice,
        max_running_req=max_b,
        kv_tokens=max_b * (plan.prompt_len + n + 1),
        graph_bs=sorted(plan.batch_sizes),
        max_seq_len=plan.prompt_len + n + 1,
    )
    vocab = engine.model_config.vocab_size
    driver = StaticDriver(engine)  # reused across calls: finished requests give their rows and pages back
    engines = [] if ENGINE_EAGER in skip else [(ENGINE_EAGER, False)]
    if graphs_captured(engine):
        if ENGINE_GRAPHS not in skip:
            engines.append((ENGINE_GRAPHS, True))
    elif cuda:
        log("engine: no CUDA graphs were captured; the cuda-graphs row is left out")
    contenders = [engine_contender(driver, name, on, mode) for name, on in engines for mode in modes]
    greedy_names = {name for name, _ in engines} | {HF_EAGER, HF_STATIC}
    profiled = engines[-1:] if profile else []  # graphs where captured, else eager
    profiles: list[dict[str, Any]] = []
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
            sampled = sampled_batch_sizes is None or b in sampled_batch_sizes
            active = [c for c in contenders if sampled or c.name in greedy_names]
            b_modes = tuple(m for m in modes if sampled or m == GREEDY)
            outputs: dict[str, Prompts] = {}
            for c in active:  # warm-up: compiles, captures, allocator growth; the static compile needs both shapes
                for times in (c.t_n, c.t_1, c.c_n, c.c_1):
                    times.clear()
                outputs[c.name] = c.run(prompts, n)[2]
                c.run(prompts, 1)
            for r in range(plan.repeats):
                for c in active:
                    c.measure(prompts, n)
                walls = ", ".join(f"{c.name} {c.t_n[-1]:.3f}s (1 token: {c.t_1[-1]:.3f}s)" for c in active)
                log(f"B={b} round {r + 1}/{plan.repeats}: {walls}")
            for c in active:
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
            mean_context = plan.prompt_len + plan.new_tokens // 2  # what the rows' steps average, not the prompt
            for (name, on), mode in product(profiled, b_modes):
                profiles.append(profile_row(engine, b, mean_context, mode, on, labelled(name, mode)))
                p = profiles[-1]
                log(f"B={b} profile {p['method']}: {p['kernels_per_step']} kernels/step, "
                    f"summed kernel time {p['device_ms_per_step']} ms, graph {p['graph_ms_per_step']} ms, "
                    f"host {p['host_ms_per_step']:.3f} ms")
                # The graph's critical path where there is one: summed durations count PDL overlap twice.
                for k in (p["critical_kernels"] or p["top_kernels"])[:8]:
                    log(f"    {k['us_per_step']:8.1f} us {k['per_step']:6.1f}x  {k['name'][:90]}")
                if p["critical_layer"]:
                    log("    one layer: " + ", ".join(f"{k['name'][:40]} {k['us']:.2f}" for k in p["critical_layer"]))
    ratios = grid_ratios(contenders_by_batch(rows), n, modes)
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
        "sampling": list(modes),
        "profile": profiles,
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


def grid_ratios(
    by_batch: dict[int, dict[str, GridRow]], n: int, modes: tuple[str, ...] = (GREEDY,)
) -> list[dict[str, Any]]:
    """Per B and pair: tokens/s ratio (a over b) and ms/step ratio (a over b), medians of per-round ratios; each
    sampled engine row is paired with its greedy row (sampled / greedy)."""
    pairs = [
        (ENGINE_EAGER, HF_EAGER),
        (ENGINE_GRAPHS, HF_EAGER),
        (ENGINE_GRAPHS, HF_STATIC),
        (ENGINE_EAGER, HF_STATIC),
        (ENGINE_GRAPHS, ENGINE_EAGER),
    ] + [(labelled(e, mode), e) for e in (ENGINE_GRAPHS, ENGINE_EAGER) for mode in modes if mode != GREEDY]
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
