"""What runs: each contender is one timed call (prompts, n) -> the n new tokens of each prompt. This engine through
the static driver, HF generate in this process, or HF generate in a persistent child process of its own
(IsolatedHF, served by serve_hf), which times each call itself.
"""

from __future__ import annotations

import multiprocessing
import traceback
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import torch

from engine.driver import StaticDriver
from oracle.hf import greedy_generation_config

from ..common import ModelChoice, graphs, timed_both
from .sampling import GREEDY, labelled, request_params

ENGINE_EAGER = "engine eager"
ENGINE_GRAPHS = "engine cuda-graphs"
HF_EAGER = "hf eager"
HF_STATIC = "hf static+compile"

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


def engine_contender(driver: StaticDriver, name: str, use_graphs: bool, mode: str = GREEDY) -> Contender:
    """The engine behind `driver` (one per engine: a newer driver retires the older) sampling as `mode` says."""
    engine = driver.engine

    def generate(prompts: Prompts, n: int) -> Prompts:
        with graphs(engine, use_graphs):
            gens = driver.generate(prompts, request_params(mode, [n] * len(prompts)))
        return [g.output_ids for g in gens]

    return Contender(labelled(name, mode), timed_generate(generate, engine.device.torch_device))


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
