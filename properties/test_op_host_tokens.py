"""The host-token path under a slow device (CUDA): every step's forward_batch is preceded by a spinning kernel on
the caller's stream, which the engine's stream waits for, so each step's device-to-host copy lands long after
forward_batch returns. ForwardOutput.result() and the driver's overlapped loop (pass N+1 started before pass N's
tokens are read) must still hand back exactly the tokens of an unhurried run: a read that does not wait for the
copy's event, or a token of step N used before it lands, returns stale host memory instead. Marker ``kernel``."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine
from oracle.budget import examples
from oracle.drive import TINY_VOCAB, EnginePool, draw_engine, run_requests
from oracle.strategies import batches, sampling_params, seeds

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

SLOW_CYCLES = 20_000_000
"""Clock cycles each step waits for before it runs: ~10 ms on an H200, far longer than a tiny model's step."""


@contextmanager
def slowed(engine: Engine) -> Iterator[None]:
    """Queue a spinning kernel on the caller's stream before every forward_batch of `engine`."""
    original = engine.forward_batch

    def slow(*args: object, **kwargs: object) -> object:
        torch.cuda._sleep(SLOW_CYCLES)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    engine.forward_batch = slow  # type: ignore[method-assign]
    try:
        yield
    finally:
        del engine.forward_batch


@settings(max_examples=examples(0.4))
@given(data=st.data())
def test_host_tokens_wait_for_their_copy(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool
) -> None:
    engine, page_size = draw_engine(data, tiny_models, engines)
    params = sampling_params(TINY_VOCAB, max_tokens=st.integers(2, 10))
    specs = data.draw(batches(TINY_VOCAB, 4, 40, page_size, params), label="requests")
    seed = data.draw(seeds, label="sampler_seed")
    calm = run_requests(engine, specs, sampler_seed=seed)
    with slowed(engine):
        hurried = run_requests(engine, specs, sampler_seed=seed)
    for i, (a, b) in enumerate(zip(calm, hurried)):
        assert a.output_ids == b.output_ids, (
            f"request {i}: under a slow device the host read {b.output_ids}, an unhurried run {a.output_ids}: "
            "a host token was read before its device-to-host copy landed (ForwardOutput.result / the overlap loop)"
        )
