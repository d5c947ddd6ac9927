"""How the requests of a grid or offline row sample: greedy (every row until now), a mixed batch cycling through
top-k, top-p, min-p and greedy requests (unseeded), or a seeded one (every request sampled with a seed of its own).
EOS is ignored in each, so every request makes exactly its max_tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from engine import SamplingParams

GREEDY, MIXED, SEEDED = "greedy", "mixed", "seeded"
MODES = (GREEDY, MIXED, SEEDED)
# Greedy last, so a batch of one samples: the B 1 row of a mixed batch replays the sampled graph, not the greedy one.
MIXED_CYCLE = (
    SamplingParams(temperature=0.8, top_k=20),
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=0.8, min_p=0.05),
    SamplingParams(),
)


def request_params(mode: str, max_tokens: Sequence[int]) -> list[SamplingParams]:
    """One SamplingParams per request of a `mode` batch, request i making max_tokens[i] tokens."""
    if mode == GREEDY:
        base = [SamplingParams() for _ in max_tokens]
    elif mode == MIXED:
        base = [MIXED_CYCLE[i % len(MIXED_CYCLE)] for i in range(len(max_tokens))]
    elif mode == SEEDED:
        base = [SamplingParams(temperature=0.8, top_p=0.9, seed=i) for i in range(len(max_tokens))]
    else:
        raise ValueError(f"unknown sampling mode {mode!r}; use one of {', '.join(MODES)}")
    return [replace(p, max_tokens=n, ignore_eos=True) for p, n in zip(base, max_tokens)]


def labelled(name: str, mode: str) -> str:
    """A row's label: the contender's name, with the mode in brackets unless greedy (whose labels stay as they were)."""
    return name if mode == GREEDY else f"{name} [{mode}]"


def modes(text: str) -> tuple[str, ...]:
    """A comma list of modes, in MODES order; ValueError on an unknown one or none."""
    named = {m.strip() for m in text.split(",") if m.strip()}
    if not named or not named <= set(MODES):
        raise ValueError(f"sampling modes: give a comma list of {', '.join(MODES)}, not {text!r}")
    return tuple(m for m in MODES if m in named)
