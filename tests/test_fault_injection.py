"""Fault injection: an exception inside a forward pass leaves the engine usable and the next batch correct.

forward_batch advances the requests (complete_one) only after the model and the sampler succeeded, and the
Context forgets the batch on the way out, so a failed pass changes no request. What it may have written is KV
for the batch's own new tokens, in slots no cached token uses; the retry writes them again. The driver puts
back what it changed before the pass (prefill targets, popped chunks), so step() can simply run again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import Engine, EngineConfig, Req, SamplingParams
from engine.driver import PageLayout, StaticDriver
from oracle.pytest_plugin import OraclePool

VOCAB = 512
MAX_TOKENS = 8
PARAMS = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True)


class InjectedFault(RuntimeError):
    pass


def fail_once(fn: Callable[..., Any], when: Callable[..., bool] = lambda *a: True, after: bool = False) -> Any:
    """fn, except that the first call for which when(*args) holds raises (after running fn, if `after`)."""
    armed = [True]

    def wrapper(*args: Any) -> Any:
        if armed[0] and when(*args):
            armed[0] = False
            if after:
                fn(*args)
            raise InjectedFault("injected fault")
        return fn(*args)

    return wrapper


def _prompt(seed: int, length: int) -> list[int]:
    return torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _engine(model: Path, page_size: int = 2) -> Engine:
    config = EngineConfig(str(model), device="cpu", page_size=page_size, num_page_override=64, max_running_req=4)
    return Engine(config, sampler_seed=0)


def _in_layer(engine: Engine, mp: pytest.MonkeyPatch) -> None:
    layer = engine.model.model.layers[1]
    mp.setattr(layer, "forward", fail_once(layer.forward))


def _after_kv_write(engine: Engine, mp: pytest.MonkeyPatch) -> None:
    # Layer 1 stores its KV and attends, then fails: both layers wrote the batch's new slots.
    backend = engine.attn_backend
    mp.setattr(backend, "forward", fail_once(backend.forward, when=lambda *a: a[1] == 1, after=True))


def _in_sampler(engine: Engine, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(engine.sampler, "sample_deferred", fail_once(engine.sampler.sample_deferred))


SITES: dict[str, Callable[[Engine, pytest.MonkeyPatch], None]] = {
    "decoder layer": _in_layer,
    "attention after its KV write": _after_kv_write,
    "sampler": _in_sampler,
}


def _live_state(driver: StaticDriver) -> dict[int, tuple[Any, ...]]:
    """Per running request: its lengths, tokens, outputs, pending chunks and the KV of its cached tokens."""
    engine = driver.engine
    buf = engine.kv_cache.buffer
    slots_view = buf.view(2, buf.shape[1], -1, buf.shape[-2], buf.shape[-1])  # [2, layers, slots, heads, dim]
    state = {}
    for uid, seq in driver.running.items():
        req = seq.req
        slots = engine.page_table[req.table_idx, : req.cached_len].long()
        state[uid] = (
            req.cached_len,
            req.device_len,
            list(req.token_ids),
            list(seq.output_ids),
            list(seq.chunks),
            slots_view[:, :, slots].clone(),
        )
    return state


def _assert_same(before: dict[int, tuple[Any, ...]], after: dict[int, tuple[Any, ...]]) -> None:
    assert before.keys() == after.keys()
    for uid in before:
        assert before[uid][:5] == after[uid][:5], f"request {uid} changed"
        assert torch.equal(before[uid][5], after[uid][5]), f"the cached KV of request {uid} changed"


def _scenario(engine: Engine, phase: str) -> tuple[StaticDriver, dict[int, list[int]]]:
    """Two requests decoding; for a prefill fault, a third one waits with its prompt in two chunks."""
    driver = StaticDriver(engine, PageLayout("shuffled", seed=2))
    prompts = {driver.add(p, PARAMS): p for p in (_prompt(1, 5), _prompt(2, 9))}
    driver.step()
    driver.step()
    if phase == "prefill":
        p = _prompt(3, 6)
        prompts[driver.add(p, PARAMS, chunk_sizes=(2, 4))] = p
    return driver, prompts


@pytest.mark.parametrize("phase", ["prefill", "decode"])
@pytest.mark.parametrize("site", list(SITES))
def test_fault_in_forward_leaves_engine_usable(
    qwen3: Path, oracle: OraclePool, monkeypatch: pytest.MonkeyPatch, site: str, phase: str
) -> None:
    engine = _engine(qwen3)
    driver, prompts = _scenario(engine, phase)
    before = _live_state(driver)
    SITES[site](engine, monkeypatch)
    with pytest.raises(InjectedFault):
        driver.step()
    assert engine.ctx._batch is None, "the Context still holds the failed batch"
    _assert_same(before, _live_state(driver))
    driver.run()  # the fault fired once: the same step now runs
    ref = oracle(qwen3, torch.float32)
    for uid, prompt in prompts.items():
        assert driver.result(uid).output_ids == ref.greedy(prompt, MAX_TOKENS), f"request {uid}"
    engine.shutdown()


def test_the_same_batch_runs_again_after_a_fault(
    qwen3: Path, oracle: OraclePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = _engine(qwen3, page_size=1)
    prompt = _prompt(4, 7)
    engine.page_table[0, :8] = 10 + torch.arange(8, dtype=torch.int32)
    req = Req(torch.tensor(prompt, dtype=torch.int32), 0, 0, 1, 0, SamplingParams(max_tokens=1))
    batch, args = engine.prepare_batch([req], "prefill")
    _in_layer(engine, monkeypatch)
    with pytest.raises(InjectedFault):
        engine.forward_batch(batch, args)
    assert (req.cached_len, req.device_len) == (0, 7) and engine.ctx._batch is None
    out = engine.forward_batch(batch, args)
    assert int(out.next_tokens_cpu[0]) == oracle(qwen3, torch.float32).greedy(prompt, 1)[0]
    assert (req.cached_len, req.device_len) == (7, 8)
    engine.shutdown()


def test_nan_logits_of_one_request_leave_the_others_exactly_as_without_it(
    qwen3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sampled requests (unseeded ones draw from the engine's generator, a seeded one from its own): the driver
    finishes the NaN request with finish_reason "error" and runs the step again for the others, who produce
    exactly the tokens of a run that never had it."""
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=6, ignore_eos=True),
        SamplingParams(temperature=50.0, max_tokens=6, ignore_eos=True),  # near uniform: the noise decides
        SamplingParams(temperature=1.2, top_k=20, max_tokens=6, ignore_eos=True, seed=11),
    ]
    prompts = [_prompt(5, 4), _prompt(6, 7), _prompt(7, 3)]
    reference = StaticDriver(_engine(qwen3))
    ref_uids = [reference.add(p, sp) for p, sp in zip(prompts, params)]
    reference.run()
    expected = [reference.result(u).output_ids for u in ref_uids]
    reference.engine.shutdown()

    engine = _engine(qwen3)
    driver = StaticDriver(engine)
    uids = [driver.add(p, sp) for p, sp in zip(prompts, params)]
    bad = driver.add(_prompt(8, 5), params[0])
    forward = engine.model.forward

    def poison(*args: Any) -> torch.Tensor:
        logits = forward(*args)
        for row, req in enumerate(engine.ctx.batch.reqs):
            if req.uid == bad:
                logits[row] = math.nan
        return logits

    monkeypatch.setattr(engine.model, "forward", poison)
    produced = driver.step()
    assert sorted(produced) == uids and bad not in driver.running
    failed = driver.result(bad)
    assert failed.finish_reason == "error" and failed.output_ids == []
    assert failed.error is not None and f"request(s) [{bad}]" in failed.error and "NaN logits" in failed.error
    driver.run()
    assert [driver.result(u).output_ids for u in uids] == expected
    engine.shutdown()
