"""The overlapped driver (StaticDriver.run and generate): the next pass is built and started before the current
one's tokens are read, with the decode inputs taken from the rows' device-side last tokens. These tests pin what
must not change: the tokens of the step-by-step driver, the bookkeeping, and exact recovery from a failed pass
while the next one is in flight."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import Engine, EngineConfig, InvalidRequestError, Req, SamplingParams
from engine.driver import StaticDriver
from oracle.drive import hand_passes

VOCAB = 512


def _engine(model: Path) -> Engine:
    config = EngineConfig(str(model), device="cpu", page_size=2, num_page_override=96, max_running_req=4)
    return Engine(config, sampler_seed=0)


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return [torch.randint(0, VOCAB, (3 + 2 * i,), generator=g).tolist() for i in range(n)]


PARAMS = [
    SamplingParams(max_tokens=7, ignore_eos=True),
    SamplingParams(temperature=0.9, top_p=0.9, max_tokens=5, ignore_eos=True),  # the engine's generator
    SamplingParams(temperature=1.1, top_k=30, max_tokens=9, ignore_eos=True, seed=5),
]


def _stepwise(driver: StaticDriver, prompts: list[list[int]], params: list[SamplingParams]) -> list[Any]:
    uids = [driver.add(p, sp) for p, sp in zip(prompts, params)]
    while driver.running:
        driver.step()
    return [driver.result(u) for u in uids]


def test_overlapped_generate_gives_the_step_by_step_tokens_and_logits(qwen3: Path) -> None:
    """Same schedule (everything admitted at once, lengths fixed): tokens and recorded logits bitwise equal,
    sampled rows included, since the draws happen in the same order."""
    prompts = _prompts(3)
    expected = _stepwise(StaticDriver(_engine(qwen3), record_logits=True), prompts, PARAMS)
    engine = _engine(qwen3)
    got = StaticDriver(engine, record_logits=True).generate(prompts, PARAMS)
    for want, have in zip(expected, got):
        assert have.output_ids == want.output_ids and have.finish_reason == want.finish_reason
        assert all(torch.equal(a, b) for a, b in zip(want.logits, have.logits))
    assert engine.live_rows == {}


def test_a_request_ending_on_eos_rides_one_pass_more_and_returns_everything(qwen3: Path) -> None:
    """The pass after its EOS token was already started when the token is read: its extra token is dropped,
    and its row and pages come back once the run ends."""
    prompts = _prompts(2)
    plain = StaticDriver(_engine(qwen3)).generate(prompts, SamplingParams(max_tokens=8, ignore_eos=True))
    eos = plain[0].output_ids[2]  # request 0 stops at its third token
    engine = _engine(qwen3)
    driver = StaticDriver(engine, eos_token_ids=[eos])
    got = driver.generate(prompts, [SamplingParams(max_tokens=8), SamplingParams(max_tokens=8, ignore_eos=True)])
    first = plain[0].output_ids
    assert got[0].output_ids == first[: first.index(eos) + 1] and got[0].finish_reason == "eos"
    assert got[1].output_ids == plain[1].output_ids
    allocator = driver.pages.allocator
    assert sorted(allocator.free) == list(range(allocator.total)) and allocator.reserved == 0
    assert sorted(driver.requests.free_rows) == list(range(4)) and engine.live_rows == {}


@pytest.mark.parametrize("poisoned_pass", [1, 3])
def test_a_failed_pass_undoes_the_one_started_after_it(
    qwen3: Path, monkeypatch: pytest.MonkeyPatch, poisoned_pass: int
) -> None:
    """Pass k (1: the prefill, 3: a decode) gives one request NaN logits while pass k+1 is in flight. Pass k+1
    is undone first, then pass k; the request finishes with "error" and the others produce exactly the tokens
    of a run that never had it (the random streams were put back too)."""
    prompts = _prompts(3)
    reference = StaticDriver(_engine(qwen3)).generate(prompts, PARAMS)
    engine = _engine(qwen3)
    driver = StaticDriver(engine)
    forward = engine.model.forward
    calls = [0]
    bad_prompt = _prompts(4)[3]

    def poison(*args: Any) -> torch.Tensor:
        logits = forward(*args)
        calls[0] += 1
        if calls[0] == poisoned_pass:
            for row, req in enumerate(engine.ctx.batch.reqs):
                if req.uid == 3:
                    logits[row] = math.nan
        return logits

    monkeypatch.setattr(engine.model, "forward", poison)
    got = driver.generate([*prompts, bad_prompt], [*PARAMS, PARAMS[0]])
    assert got[3].finish_reason == "error" and "NaN logits" in (got[3].error or "")
    assert [g.output_ids for g in got[:3]] == [r.output_ids for r in reference]
    assert engine.live_rows == {} and driver.pages.allocator.reserved == 0


def test_hand_driven_passes_can_run_one_ahead_of_the_host(qwen3: Path) -> None:
    """The seed's hand-driven loop, pipelined: pass k+1 starts before pass k's tokens are appended (it reads them
    on the device), and the tokens equal those of the loop that appends before each pass. Two passes ahead is
    refused: only the last token is kept on the device."""

    def run(pipelined: bool) -> list[list[int]]:
        engine = _engine(qwen3)
        engine.page_table[:2, :16] = torch.arange(32, dtype=torch.int32).view(2, 16)
        reqs = [Req(p, i, 0, 4, i, PARAMS[i]) for i, p in enumerate(_prompts(2))]
        started = [0]

        def launch(batch: list[Req], phase: str) -> Any:
            out = engine.forward_batch(*engine.prepare_batch(batch, phase))  # type: ignore[arg-type]
            if pipelined and started[0]:  # the previous pass is still in flight: now two ahead of the host
                with pytest.raises(InvalidRequestError, match="known tokens"):
                    engine.prepare_batch(batch, "decode")
            started[0] += 1
            return out

        return hand_passes(engine, reqs, ["prefill", "decode", "decode", "decode"], pipelined, launch)

    assert run(pipelined=True) == run(pipelined=False)


def test_undoing_a_pass_leaves_a_row_released_since_released(qwen3: Path) -> None:
    """The overlapped driver may finish a request (and release its row) while a later pass with it is in flight;
    if that pass is then undone, the row stays released instead of coming back as the request's live KV."""
    engine = _engine(qwen3)
    engine.page_table[0, :16] = torch.arange(16, dtype=torch.int32)
    req = Req(_prompts(1)[0], 0, 0, 4, 7, PARAMS[0])
    hand_passes(engine, [req], ["prefill"], pipelined=False)
    out = engine.forward_batch(*engine.prepare_batch([req], "decode"))
    assert engine.live_rows[0] == (req.cached_len, 7)
    engine.release_rows([0])
    out.undo()
    assert 0 not in engine.live_rows and (req.cached_len, req.device_len) == (3, 4)
    hand_passes(engine, [req], ["decode"], pipelined=False)  # the row is free again: the request reruns there
    assert engine.live_rows[0] == (4, 7)
    out = engine.forward_batch(*engine.prepare_batch([req], "decode"))
    out.undo()
    assert engine.live_rows[0] == (4, 7)  # not released this time: the entry before the pass comes back
