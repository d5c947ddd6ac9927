"""Property 12: a step's outputs are its own. What forward_batch returned for step N (logits, next_tokens and
next_tokens_cpu) is unchanged after steps N+1, N+2, ... run, and its logits are float32 whatever the model's dtype.

Requests (greedy or sampled, on their own page-table rows via oracle.drive.place) are prefilled together and then
decoded together for 2..4 steps, the caller holding every step's ForwardOutput. Each step's tensors are cloned as
soon as its copy_done_event completes; after the last step every held tensor must equal its clone bitwise. An engine
that hands out a view of a buffer it reuses (a persistent logits buffer; on CUDA, a graph's static output, which the
next replay overwrites) fails: every decode step of the same batch size writes the same buffer. On a target with
CUDA graphs the decode steps replay graphs (all requests of a step fit the captured sizes), so the same property
covers the graph path.

Vacuity floors (oracle.coverage), per example: two successive steps produced different logits (else an overwrite
could not show); a decode step replayed a graph, on a target with CUDA graphs (an example elsewhere counts as a
hit, so the label is judged on every target).
"""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Engine, Req
from engine.step import ForwardOutput
from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.drive import TINY_VOCAB, EnginePool, draw_engine, place
from oracle.strategies import batches, sampling_params, seeds

MAX_DECODE_STEPS = 4


def run_step(engine: Engine, reqs: list[Req], phase: str) -> tuple[ForwardOutput, list[torch.Tensor], bool]:
    """One forward pass of reqs: its output, clones of its tensors taken once it completed, and whether it replayed
    a CUDA graph."""
    batch, args = engine.prepare_batch(reqs, phase)  # type: ignore[arg-type]  # "prefill" or "decode"
    replayed = engine.graph_runner.can_use_graph(batch)
    out = engine.forward_batch(batch, args)
    out.copy_done_event.synchronize()
    clones = [t.clone() for t in (out.logits, out.next_tokens_gpu, out.next_tokens_cpu)]
    for req, token in zip(reqs, out.next_tokens_cpu.tolist()):
        req.append_host(token)
    return out, clones, replayed

MOVED = "step outputs: successive steps' logits differ"
GRAPHED = "step outputs: a decode step replayed a CUDA graph (where graphs are on)"


@settings(max_examples=examples(0.8))
@given(data=st.data())
@floors({MOVED: 0.9, GRAPHED: 0.9})
def test_a_steps_outputs_survive_later_steps(
    data: st.DataObject, tiny_models: dict[str, Path], engines: EnginePool
) -> None:
    engine, page_size = draw_engine(data, tiny_models, engines)
    decode_steps = data.draw(st.integers(2, MAX_DECODE_STEPS), label="decode_steps")
    params = sampling_params(TINY_VOCAB, max_tokens=st.just(decode_steps + 1))
    specs = data.draw(batches(TINY_VOCAB, 4, 32, page_size, params), label="requests")
    engine.sampler.reseed(data.draw(seeds, label="sampler_seed"))
    reqs = [place(engine, s.prompt, 0, row, s.params) for row, s in enumerate(specs)]
    steps = [run_step(engine, reqs, "prefill")]
    steps += [run_step(engine, reqs, "decode") for _ in range(decode_steps)]
    for n, (out, (logits, tokens, tokens_cpu), _) in enumerate(steps):
        what = f"step {n} of {len(steps)} ({len(reqs)} requests)"
        assert out.logits.dtype == torch.float32, f"{what}: logits handed out as {out.logits.dtype}, not float32"
        assert torch.equal(out.logits, logits), f"{what}: its logits changed when later steps ran"
        assert torch.equal(out.next_tokens_gpu, tokens), f"{what}: its next_tokens changed when later steps ran"
        assert torch.equal(out.next_tokens_cpu, tokens_cpu), f"{what}: next_tokens_cpu changed when later steps ran"
    moved = any(not torch.equal(a[1][0], b[1][0]) for a, b in zip(steps, steps[1:]))
    exercised(MOVED, moved)
    exercised(GRAPHED, not engine.graph_runner.enabled or any(s[2] for s in steps))
