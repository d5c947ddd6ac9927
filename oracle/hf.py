"""The HF reference: the same model dir as the engine, run by transformers.

Greedy generation ignores EOS (exactly n new tokens), and no generation_config default may inject a logits
processor (top_k=50 and friends): generate gets an explicit, empty GenerationConfig. greedy_until_eos is the one
exception: it stops where HF's generate stops by default, on the EOS ids transformers itself loaded for the model
(generation_config.json's, else config.json's). Results are cached per (prompt, n, dtype).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import torch


class HFOracle:
    def __init__(self, model_path: str | Path, dtype: torch.dtype = torch.float64, device: str = "cpu") -> None:
        self.model_path = str(model_path)
        self.dtype = dtype
        self.device = torch.device(device)
        self._cache: dict[tuple[str, tuple[int, ...], int, torch.dtype], torch.Tensor] = {}
        self._model_eos_ids: tuple[int, ...] = ()  # set when the model loads

    @cached_property
    def model(self) -> Any:  # a transformers PreTrainedModel; typed loosely, transformers is untyped here
        from transformers import AutoModelForCausalLM

        # MoE experts: the default grouped_mm kernels have no float64 path on CPU; the eager loop runs in any dtype.
        model: Any = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=self.dtype, experts_implementation="eager"
        )
        # generate() fills unset fields (eos_token_id above all) from the model's generation_config, so an
        # explicit None in our config would not stop it at EOS; the oracle owns this instance, so clear them.
        self._model_eos_ids = _as_ids(model.generation_config.eos_token_id)
        model.generation_config.eos_token_id = None
        model.generation_config.bos_token_id = None
        return model.to(self.device).eval()

    @cached_property
    def vocab_size(self) -> int:
        return int(self.model.config.vocab_size)

    def _ids(self, tokens: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(tokens)], dtype=torch.long, device=self.device)

    @torch.no_grad()
    def greedy(self, prompt: Sequence[int], n: int) -> list[int]:
        """Exactly n greedy tokens from HF generate, EOS ignored."""
        key = ("greedy", tuple(prompt), n, self.dtype)
        if key not in self._cache:
            config = greedy_generation_config(n)
            out = self.model.generate(
                self._ids(prompt), attention_mask=torch.ones_like(self._ids(prompt)), generation_config=config
            )
            new = out[0, len(prompt) :].cpu()
            if len(new) != n:
                raise RuntimeError(f"HF generate returned {len(new)} tokens instead of {n}; EOS was not ignored")
            self._cache[key] = new
        return self._cache[key].tolist()

    @torch.no_grad()
    def greedy_until_eos(self, prompt: Sequence[int], n: int) -> list[int]:
        """Up to n greedy tokens from HF generate, stopping after the first of HF's own EOS ids (model_eos_ids)."""
        key = ("greedy_until_eos", tuple(prompt), n, self.dtype)
        if key not in self._cache:
            config = greedy_generation_config(n, eos_token_ids=self.model_eos_ids)
            out = self.model.generate(
                self._ids(prompt), attention_mask=torch.ones_like(self._ids(prompt)), generation_config=config
            )
            self._cache[key] = out[0, len(prompt) :].cpu()
        return self._cache[key].tolist()

    @property
    def model_eos_ids(self) -> tuple[int, ...]:
        """The EOS ids transformers loaded with the model, the ones its generate stops on by default."""
        self.model  # noqa: B018 - loading the model records them
        return self._model_eos_ids

    @cached_property
    def config_eos_ids(self) -> tuple[int, ...]:
        """config.json's EOS ids alone, as transformers parsed them."""
        return _as_ids(self.model.config.eos_token_id)

    @torch.no_grad()
    def teacher_forced_logits(self, tokens: Sequence[int]) -> torch.Tensor:
        """Logits at every position of a full sequence: row i predicts token i + 1. [len, vocab], on CPU."""
        key = ("forced", tuple(tokens), 0, self.dtype)
        if key not in self._cache:
            self._cache[key] = self.model(self._ids(tokens)).logits[0].cpu()
        return self._cache[key]

    def prefill_logits(self, prompt: Sequence[int]) -> torch.Tensor:
        """Logits of the token after the prompt. [vocab]."""
        return self.teacher_forced_logits(prompt)[-1]


def _as_ids(eos: Any) -> tuple[int, ...]:
    """An eos_token_id setting (None, an id or a list of them) as a tuple of ids."""
    if eos is None:
        return ()
    return tuple(int(i) for i in eos) if isinstance(eos, (list, tuple)) else (int(eos),)


def greedy_generation_config(
    n: int, static_cache_len: int | None = None, eos_token_ids: Sequence[int] = ()
) -> Any:
    """Exactly n greedy tokens with no logits processor: every sampling knob explicitly off, no EOS (or up to n,
    stopping after any of eos_token_ids).

    static_cache_len selects HF's static cache of that length (one shape for every n: no recompiles).
    The model's own generation_config must not carry an eos_token_id either; generate() fills unset fields from it.
    """
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=False,
        max_new_tokens=n,
        min_new_tokens=None,
        eos_token_id=list(eos_token_ids) or None,
        pad_token_id=0,
        top_k=None,
        top_p=None,
        temperature=None,
        repetition_penalty=None,
        cache_implementation="static" if static_cache_len else None,
        max_cache_len=static_cache_len,
    )

