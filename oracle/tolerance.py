"""Tolerances, from one place: every logit bound and near-tie rule of the harness follows from the engine's dtype.

Logit bound against a float64 reference: ``max |engine - ref| <= rel * max(1, max |ref|)``. It scales with the
row's largest logit because rounding error does (a matmul's error is relative to the magnitude of what it sums).
Measured on the tiny models and SmolLM2-135M with prompts up to 64 tokens:

* float32: worst error / scale about 1.5e-6 (SmolLM2, 30 layers), 6e-7 (tiny). rel = 5e-5 leaves a margin of 30x
  or more; any real bug (a position off by one, a wrong mask, a stale KV slot) moves logits by O(0.1..1).
* bfloat16: worst error / scale about 0.014 (tiny, CPU and H200), 0.033 (SmolLM2 on CPU); on the H200 FlashInfer
  against the torch backend differs by one bf16 ulp at the largest logits (about 1% of the scale). rel = 0.06.

Near-tie: a token whose logit is within the tie gap (twice the bound: each of two logits may be off by one bound)
of its row's largest. Greedy runs may legitimately pick any token of such a tie, seen from both sides; with bf16's
gap (about 3 logits on the tiny models) three tokens can tie, which a random tiny model showed on the H200.

Yardstick: where HF itself runs at the engine's dtype, its own error against float64 on the same tokens is the
measure of what that dtype can do: an engine row may be ``YARDSTICK_RATIO`` times as far from float64 as HF's own
(SmolLM2's bf16 rounding over 30 layers reaches the bound in HF's run as in ours). Float32 gets no such allowance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

YARDSTICK_RATIO = 1.5


@dataclass(frozen=True)
class LogitTolerance:
    """``max |actual - reference| <= rel * max(1, max |reference|)``."""

    rel: float
    dtype: torch.dtype

    def bound(self, reference: torch.Tensor) -> float:
        return self.rel * max(1.0, float(reference.abs().max()))

    def tie_gap(self, reference_row: torch.Tensor) -> float:
        """Logits closer than this may swap places between engine and reference."""
        return 2.0 * self.bound(reference_row)

    def near_tie(self, row: torch.Tensor, token: int) -> bool:
        """Whether `token`'s logit is within the tie gap of the row's largest (the row's best itself included)."""
        return float(row.double().max() - row[token].double()) <= self.tie_gap(row)

    def yardstick_bound(self, reference: torch.Tensor, own_error: float | None) -> float:
        """The bound, widened to YARDSTICK_RATIO x HF's own error at this dtype where it is known (not float32)."""
        if own_error is None or self.dtype == torch.float32:
            return self.bound(reference)
        return max(self.bound(reference), YARDSTICK_RATIO * own_error)


LOGIT_TOLERANCES: dict[torch.dtype, LogitTolerance] = {
    torch.float32: LogitTolerance(5e-5, torch.float32),
    torch.bfloat16: LogitTolerance(0.06, torch.bfloat16),
}


def logit_tolerance(dtype: torch.dtype) -> LogitTolerance:
    if dtype not in LOGIT_TOLERANCES:
        raise ValueError(f"no logit tolerance for engine dtype {dtype}; known: {sorted(map(str, LOGIT_TOLERANCES))}")
    return LOGIT_TOLERANCES[dtype]


def logits_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """Largest absolute difference, computed in float64."""
    if actual.shape != reference.shape:
        raise ValueError(f"shape mismatch: {tuple(actual.shape)} vs {tuple(reference.shape)}")
    return float((actual.double() - reference.double()).abs().max())


# ---- op level: one kernel call against its reference (oracle/ops) -----------------------------------------------

UNIT_ROUNDOFF: dict[torch.dtype, float] = {
    torch.float64: 2.0**-53,
    torch.float32: 2.0**-24,
    torch.bfloat16: 2.0**-8,
    torch.float16: 2.0**-11,
}
"""Half the spacing of a dtype's values at 1: one rounding moves a value by at most this share of it."""


def unit_roundoff(dtype: torch.dtype) -> float:
    if dtype not in UNIT_ROUNDOFF:
        raise ValueError(f"no unit roundoff for {dtype}; known: {sorted(map(str, UNIT_ROUNDOFF))}")
    return UNIT_ROUNDOFF[dtype]


def rounding_bound(reference: torch.Tensor, dtype: torch.dtype, ulps: int) -> torch.Tensor:
    """Elementwise: `ulps` units in the last place of `dtype` at each reference value (0: bitwise). An op that
    keeps HF's rounding steps and differs only in the order of a float32 sum lands within 1 ulp of HF's result
    (the Triton norms and SiLU-and-mul, measured on the H200)."""
    scale = reference.double().abs().clamp(min=torch.finfo(dtype).tiny)
    return ulps * 2.0 * unit_roundoff(dtype) * scale


def summation_bound(magnitude: torch.Tensor, terms: int, dtype: torch.dtype) -> torch.Tensor:
    """Elementwise bound of a `terms`-long sum or dot product evaluated in `dtype`, in any order, against its exact
    value: gamma_terms x sum |x_k| (`magnitude`), gamma_n = n u / (1 - n u) (Higham, Accuracy and Stability of
    Numerical Algorithms, 3.1); two evaluation orders lie within twice this of each other."""
    nu = terms * unit_roundoff(dtype)
    return nu / (1 - nu) * magnitude.double()


PARTIAL_ROUNDINGS = 8
"""Roundings of partial sums to the dtype a cuBLAS product may make (its split-K count is its own choice under
torch's default reduced-precision reduction for bf16/fp16): the worst seen on the H200 over the op suite's shapes
was 4.8 u x magnitude beyond the output's own rounding."""


def dot_bound(
    exact: torch.Tensor, magnitude: torch.Tensor, terms: int, dtype: torch.dtype, partials_rounded: bool = False
) -> torch.Tensor:
    """Elementwise bound of a float32-accumulated dot product rounded to `dtype`, against its float64 value:
    one output rounding, plus the classic worst case of a `terms`-long float32 sum, `terms` * u32 * sum |a_k b_k|
    (`magnitude`). Any order of the sum and any split of it stays inside. partials_rounded: partial sums may be
    rounded to `dtype` on the way (cuBLAS under reduced-precision reduction, or a bias added after the product's
    rounding): PARTIAL_ROUNDINGS x u x magnitude more."""
    u = unit_roundoff(dtype)
    bound = u * exact.double().abs() + terms * unit_roundoff(torch.float32) * magnitude.double()
    return bound + PARTIAL_ROUNDINGS * u * magnitude.double() if partials_rounded else bound


ATTENTION_ROUNDINGS = 4
"""Attention against float64: the output's rounding, the probabilities rounded to the input dtype before the PV
product (FlashInfer does), the score and the normalisation: each moves an output by at most u x max |v|."""


def attention_bound(max_abs_v: torch.Tensor, score_magnitude: torch.Tensor, kv_len: int, head_dim: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """Bound of attention outputs against float64, elementwise over the query rows given: ATTENTION_ROUNDINGS
    roundings at `dtype` and a `kv_len`-long float32 sum, relative to the largest |v| a row attends to, plus the
    float32 error of its scores (a `head_dim`-long sum of magnitude `score_magnitude` = max over keys of
    |q| . |k| x scale), which moves each probability by up to twice that error."""
    u32 = unit_roundoff(torch.float32)
    share = ATTENTION_ROUNDINGS * unit_roundoff(dtype) + kv_len * u32 + 2 * head_dim * u32 * score_magnitude.double()
    return share * max_abs_v.double()


KERNEL_ULPS = 1
"""A kernel that keeps HF's rounding steps and only reorders a float32 reduction (a norm's sum of squares, an exp)
lands within one ulp of HF's result; the torch reference, which runs HF's own ops, is held to 0 (bitwise)."""


FLOAT32_EXP_OVERFLOW = math.log(torch.finfo(torch.float32).max)
"""exp(x) is inf in float32 above this (about 88.72): a softmax that exponentiates attention scores without first
subtracting each row's max turns a row holding such a score into NaN. The large-magnitude check of verify builds a
model whose largest scores lie past it, and checks that they do."""
