"""The large-magnitude section of verify: a variant of the model whose last layer's queries and keys are scaled so
that the largest attention score before softmax of the prompt's last query (measured by HF float64 on the long
prompt) becomes LARGE_SCORE, past float32's exp overflow (oracle.tolerance.FLOAT32_EXP_OVERFLOW). The last query:
in the last layer only the row the logits come from reaches the output. Only the last layer: scores of ~100 make
attention nearly one-hot, and in every layer of a deep model (SmolLM2's 30) float32 rounding then picks other keys
than float64 and the logits drift by whole units; one layer shows an overflow all the same. The variant is a copy of the
weights in a temporary dir that the engine and HF both load, so both compute the same model: the scale goes into
the q/k RMSNorm weights where the model has them (Qwen3: a scaled projection would be normalized away), else into
the q/k projections and their biases (RoPE is linear, so scaling q and k by a scales every score by a²). A softmax
that exponentiates without subtracting the row's max overflows there (inf / inf: NaN); one that subtracts it must
match HF float64 within the logit bound.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch

from engine import SamplingParams
from engine.driver import StaticDriver

from ..checks import worst_logit_error
from ..hf import HFOracle
from ..target import Target
from ..tolerance import FLOAT32_EXP_OVERFLOW, logits_error
from .result import Check

LARGE_SCORE = 100.0
"""The largest pre-softmax score of the prompt's last query in the variant's last layer."""
NEW_TOKENS = 4  # decode steps read the large-score KV too
SECTION = "large magnitude"
_RECORDER = "hfparity_score_peaks"
_QK = re.compile(r"model\.layers\.(\d+)\.self_attn\.([qk])_(norm|proj)\.(weight|bias)")

_PEAKS: ContextVar[dict[int, float] | None] = ContextVar("hfparity_score_peaks", default=None)


def _recording_sdpa(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """HF's SDPA attention, after recording the layer's largest score q·k * scaling of the last query into _PEAKS."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    peaks = _PEAKS.get()
    if peaks is not None:
        keys = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        peaks[module.layer_idx] = float((query[..., -1:, :] @ keys.transpose(-1, -2)).amax() * kwargs["scaling"])
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def score_peaks(model: Any, tokens: Sequence[int]) -> list[float]:
    """Each layer's largest pre-softmax attention score of the last query of an HF model on one sequence."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(_RECORDER, _recording_sdpa)
    AttentionMaskInterface.register(_RECORDER, sdpa_mask)
    before = model.config._attn_implementation
    peaks: dict[int, float] = {}
    token = _PEAKS.set(peaks)
    try:
        model.set_attn_implementation(_RECORDER)
        with torch.no_grad():
            model(torch.tensor([list(tokens)], device=model.device))
    finally:
        _PEAKS.reset(token)
        model.set_attn_implementation(before)
    return [peaks[i] for i in sorted(peaks)]


def scaled_copy(model_dir: Path, out_dir: Path, layer: int, factor: float) -> Path:
    """A copy of model_dir in out_dir whose `layer` has its queries and keys scaled by `factor` (see the module doc
    for which tensors carry the scale); every other file is copied as is."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shards = sorted(model_dir.glob("*.safetensors"))
    names = set()
    for shard in shards:
        with safe_open(shard, "pt") as f:
            names.update(f.keys())
    normed = {int(m[1]) for m in map(_QK.fullmatch, names) if m and m[3] == "norm"}
    for path in model_dir.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, out_dir / path.name)
    for shard in shards:
        tensors = load_file(shard)
        for name, tensor in tensors.items():
            m = _QK.fullmatch(name)
            if m and int(m[1]) == layer and (m[3] == "norm") == (layer in normed):
                tensors[name] = (tensor.double() * factor).to(tensor.dtype)
        save_file(tensors, out_dir / shard.name, metadata={"format": "pt"})
    return out_dir


def check_large_magnitude(
    target: Target,
    model: Path,
    prompt: Sequence[int],
    label: str,
    hf: HFOracle,
    build: Callable[[Path], Any],
) -> list[Check]:
    """The engine (from build(model_dir), shut down here) on the scaled variant against HF float64 on the same
    variant, the prompt and NEW_TOKENS greedy tokens; first, that the variant's scores really pass the overflow."""
    peaks = score_peaks(hf.model, prompt)
    last, factor = len(peaks) - 1, math.sqrt(LARGE_SCORE / peaks[-1])
    with tempfile.TemporaryDirectory(prefix="hfparity-large-scores-") as tmp:
        variant = scaled_copy(model, Path(tmp), last, factor)
        ref = HFOracle(variant, dtype=torch.float64)
        reached = score_peaks(ref.model, prompt)[last]
        engine = build(variant)
        try:
            params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
            gen = StaticDriver(engine, record_logits=True).generate([list(prompt)], params)[0]
        finally:
            engine.shutdown()
        yardstick = None
        if target.torch_dtype != torch.float32:
            yardstick = HFOracle(variant, dtype=target.torch_dtype, device=target.device)
        checks = [Check.measured(
            SECTION, "largest attention score past float32 exp overflow", reached, FLOAT32_EXP_OVERFLOW, ">=",
            f"HF float64 on {label}, layer {last} (q and k scaled by {factor:.3g}; {peaks[-1]:.3g} before)",
        )]
        name = f"logit error, {label}"
        if gen.finish_reason == "error":
            return [*checks, Check(SECTION, name, "fail", detail=f"the engine's logits are not finite: {gen.error}")]
        tokens = [*prompt, *gen.output_ids]
        span = slice(len(prompt) - 1, len(tokens) - 1)
        rows = ref.teacher_forced_logits(tokens)[span]
        engine_rows = torch.stack(gen.logits)
        worst = worst_logit_error(engine_rows, rows)
        own = None if yardstick is None else logits_error(yardstick.teacher_forced_logits(tokens)[span], rows)
        tol = target.tolerance
        detail = (
            f"{len(rows)} steps vs HF float64 on the variant, rel {tol.rel:g}; worst at step "
            f"{worst.index[0]}: engine {worst.actual:.6g} vs HF {worst.reference:.6g}"
            + ("" if own is None else f"; HF's own {target.dtype} error {own:.3g}")
        )
        checks.append(Check.measured(SECTION, name, worst.value, tol.yardstick_bound(rows, own), "<=", detail))
    return checks
