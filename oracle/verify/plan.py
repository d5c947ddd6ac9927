"""What one verify run covers: the full and quick plans (prompts, tokens, draws, the fixed sampling grid), the
prompt set and how prompts and tokens are shown. Every plan ends its prompts with a long one (LONG_PROMPT_TOKENS:
past 256 and one past five 64-token kernel tiles), which the large-magnitude section also runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import ModelLoadError, SamplingParams

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "To make a cup of tea, first",
)
RANDOM_PROMPT_LENGTHS = (5, 12, 23, 31, 40, 47)  # page_size 4: on, before and after page boundaries
PAGE_SIZE = 4
LONG_PROMPT_TOKENS = 321  # past 256, and one past 5 x 64: a kernel that drops a partial last tile shows
# Text of our own for the long prompt, encoded and repeated until it holds LONG_PROMPT_TOKENS tokens.
LONG_TEXT = (
    "The lighthouse keeper wrote in his log every evening. He noted the wind, the height of the waves, the ships "
    "that passed the point and the ones that did not. In spring the fog came in from the sea and stayed for days, "
    "and he kept the lamp burning from noon to morning. In summer the children from the village rowed out to the "
    "rocks to look for crabs, and he counted the boats as they went and as they came back. In autumn the storms "
    "arrived, one after another, and the log filled with numbers: pressure falling, gusts rising, a mast seen "
    "broken on the horizon. In winter the island was quiet. He repaired the stairs, painted the railings, read "
    "the old logs of the keepers before him and compared their winters with his own."
)
MAX_SEQ_LEN = 384  # the long prompt plus a plan's new tokens, in whole pages
BOUNDARY_CASES = 2  # sampling cases every plan adds on the filter boundaries (statistics.boundary_cases)


@dataclass(frozen=True)
class Plan:
    name: str
    prompts: int
    max_tokens: int
    samples: int  # draws per sampling test
    kernel_examples: int  # drawn inputs per op in the kernels section (oracle.verify.kernels)
    grid: tuple[SamplingParams, ...]

    @property
    def sampling_cases(self) -> int:
        return BOUNDARY_CASES + len(self.grid)


def sampling_params(temperature: float, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


# Fixed grid points, besides the two boundary points every plan adds (statistics.boundary_cases).
# Temperature and min-p appear alone, top-p alone at a boundary point, top-k with top-p; T != 1 wherever min-p is
# on, so a threshold taken before temperature shows. Draws per test: on SmolLM2's 49k vocabulary the engine's
# sampler sorts every row (~4 ms a draw on 2 cores), so the full plan takes 1200, enough to detect Cohen's
# w ~ 0.2 with 90% power at df ~ 20 (each check states its own detectable w); the gross errors real bugs make
# (a dropped or added token of real mass, a wrong order of filters) show at a few hundred.
FULL = Plan(
    "full",
    prompts=6,
    max_tokens=16,
    samples=1200,
    kernel_examples=50,
    grid=(
        sampling_params(0.8, top_k=40, top_p=0.9),
        sampling_params(0.7),
        sampling_params(1.2, min_p=0.05),
        sampling_params(1.3, top_k=100, top_p=0.95, min_p=0.02),
    ),
)
QUICK = Plan(
    "quick",
    prompts=3,
    max_tokens=8,
    samples=1500,
    kernel_examples=8,  # the section in ~10 s on 2 CPU cores (attention prefill takes most)
    grid=(sampling_params(1.0, top_p=0.9), sampling_params(1.2, min_p=0.05)),
)


def steps_of(plan: Plan) -> int:
    """Progress units verify() reports: 2 loads, one per prompt and one for the long prompt, one per sampling case,
    and one per section as it ends (8: oracle.verify.runner)."""
    return 11 + plan.prompts + plan.sampling_cases


def describe(params: SamplingParams) -> str:
    """Sampling params in the short form the report uses, e.g. ``T=0.8 top_k=40 top_p=0.9``."""
    parts = [f"T={params.temperature:g}"]
    if params.top_k != -1:
        parts.append(f"top_k={params.top_k}")
    if params.top_p < 1.0:
        parts.append(f"top_p={params.top_p:g}")
    if params.min_p > 0.0:
        parts.append(f"min_p={params.min_p:g}")
    return " ".join(parts)


def load_tokenizer(model: Path) -> Any | None:
    """The model dir's tokenizer, or None if it has none (then prompts are random token ids)."""
    if not ((model / "tokenizer.json").is_file() or (model / "tokenizer_config.json").is_file()):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(model)
    except Exception as exc:  # transformers raises KeyError, ValueError, OSError... for a corrupt file
        raise ModelLoadError(
            f"{model}: its tokenizer (tokenizer.json / tokenizer_config.json) does not load: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}"
        ) from exc


def make_prompts(tokenizer: Any | None, count: int, vocab: int, seed: int) -> tuple[list[list[int]], list[str]]:
    """Token ids and display labels of `count` prompts and the long one (last): the tokenizer's encoding of PROMPTS
    and of LONG_TEXT (cut at LONG_PROMPT_TOKENS), or seeded random ids without a tokenizer."""
    if tokenizer is not None:
        texts = PROMPTS[:count]
        text_ids = list(tokenizer.encode(LONG_TEXT))
        long = (text_ids * -(-LONG_PROMPT_TOKENS // len(text_ids)))[:LONG_PROMPT_TOKENS]
        labels = [repr(t) for t in texts] + [f"long text ({LONG_PROMPT_TOKENS} tokens)"]
        return [list(tokenizer.encode(t)) for t in texts] + [long], labels
    gen = torch.Generator().manual_seed(seed)
    lengths = (*RANDOM_PROMPT_LENGTHS[:count], LONG_PROMPT_TOKENS)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    return prompts, [f"{n} random ids" for n in lengths]


def token_labeler(tokenizer: Any | None) -> Callable[[int], str]:
    """One token as the report shows it: its id, and its text where the model has a tokenizer."""
    if tokenizer is None:
        return str
    return lambda t: f"{t} {tokenizer.decode([t])!r}"


def text_decoder(tokenizer: Any | None) -> Callable[[Sequence[int]], str | None]:
    """A token sequence's text, or None without a tokenizer."""
    if tokenizer is None:
        return lambda _: None
    return lambda tokens: str(tokenizer.decode(list(tokens)))
