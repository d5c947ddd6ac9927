"""Op-level properties of the layer kernels: each LayerKernels method of the target, called alone on drawn
boundary inputs (widths each side of block edges, subnormal to near-overflow magnitudes, strided rows, positions at
the end of the RoPE table, KV slots past 2**31 elements, GQA head counts, one row of the benchmarked models' projection
shapes, norms over wider models' hidden sizes), against HF's op sequence (oracle/ops/layers.py states each contract),
inside guard regions, with the implementation that ran recorded (marker ``kernel``). Floors sit under the shares
random examples reach (``deep``): widths off every power of two 58-63% (floor 40%), one row of a model's projection
14-21% (floor 5%), norm_linear's one or two rows past 4096 channels 8% (floor 5%)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.budget import examples
from oracle.coverage import exercised, floors
from oracle.ops import kv_store, layers
from oracle.ops.bench import Bench

pytestmark = pytest.mark.kernel


ODD_WIDTH = "rms_norm: a width off every power of two"
WITH_NORM = "norm_rope: with a q/k norm"
ONE_ROW = "linear: a single row (the GEMV's case)"
BIG = "store_kv: slots past 2**31 elements (where memory allows two such pools)"
FUSED_ROW = "norm_linear: a single row (where the norm folds into the GEMV)"
MANY_ROWS = "linear: more rows than the GEMV's 2 (the skinny GEMM's case up to its 16, and past it)"
FUSED_ROWS = "norm_linear: more rows than the GEMV's 2 (add + RMSNorm, then the skinny GEMM or cuBLAS)"
MODEL_ROW = "linear: one row of a model's projection shape (where kernels take blocks of their own)"
FUSED_MODEL_ROW = "norm_linear: one row of a model's projection shape (where kernels take blocks of their own)"
FUSED_WIDE = "norm_linear: one or two rows past 4096 channels (the norm's sum of squares spans several K tiles)"


def model_row(x: torch.Tensor, weight: torch.Tensor) -> bool:
    return x.shape[0] == 1 and tuple(weight.shape) in layers.MODEL_PROJECTIONS


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({ODD_WIDTH: 0.4})
def test_rms_norm(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(layers.norm_cases(op_bench.dtype), label="case")
    exercised(ODD_WIDTH, case.x.shape[1] & (case.x.shape[1] - 1) != 0)
    layers.check_rms_norm(op_bench, case)


@settings(max_examples=examples(1.0))
@given(data=st.data())
def test_add_rms_norm(data: st.DataObject, op_bench: Bench) -> None:
    layers.check_add_rms_norm(op_bench, data.draw(layers.norm_cases(op_bench.dtype, with_residual=True), label="case"))


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({WITH_NORM: 0.2})
def test_norm_rope(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(layers.rope_cases(op_bench.dtype, op_bench.target.head_dim), label="case")
    exercised(WITH_NORM, case.norm_weight is not None)
    layers.check_norm_rope(op_bench, case)


@settings(max_examples=examples(1.0))
@given(data=st.data())
def test_silu_and_mul(data: st.DataObject, op_bench: Bench) -> None:
    layers.check_silu_and_mul(op_bench, data.draw(layers.gate_up_cases(op_bench.dtype), label="case"))


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({ONE_ROW: 0.2, MANY_ROWS: 0.2, MODEL_ROW: 0.05})
def test_linear(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(layers.linear_cases(op_bench.dtype), label="case")
    exercised(ONE_ROW, case.x.shape[0] == 1)
    exercised(MANY_ROWS, case.x.shape[0] > 2)
    exercised(MODEL_ROW, model_row(case.x, case.weight))
    layers.check_linear(op_bench, case)


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({FUSED_ROW: 0.2, FUSED_ROWS: 0.2, FUSED_MODEL_ROW: 0.05, FUSED_WIDE: 0.05})
def test_norm_linear(data: st.DataObject, op_bench: Bench) -> None:
    case = data.draw(layers.norm_linear_cases(op_bench.dtype), label="case")
    exercised(FUSED_ROW, case.x.shape[0] == 1)
    exercised(FUSED_ROWS, case.x.shape[0] > 2)
    exercised(FUSED_MODEL_ROW, model_row(case.x, case.weight))
    exercised(FUSED_WIDE, case.x.shape[0] <= 2 and case.x.shape[1] > 4096)
    layers.check_norm_linear(op_bench, case)


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({BIG: 0.1})
def test_store_kv(data: st.DataObject, op_bench: Bench) -> None:
    big_ok = kv_store.big_pools_fit(op_bench.device)
    case = data.draw(kv_store.store_cases(op_bench.dtype, op_bench.target.head_dim, big_ok), label="case")
    exercised(BIG, case.big or not big_ok)
    kv_store.check_store_kv(op_bench, case)


FUSED_NORM = "norm_rope_store: with q/k norms"
FUSED_BIG = "norm_rope_store: slots past 2**31 elements (where memory allows two such pools)"


@settings(max_examples=examples(2.0))
@given(data=st.data())
@floors({FUSED_NORM: 0.2, FUSED_BIG: 0.1})
def test_norm_rope_store(data: st.DataObject, op_bench: Bench) -> None:
    big_ok = kv_store.big_pools_fit(op_bench.device)
    case = data.draw(kv_store.rope_store_cases(op_bench.dtype, op_bench.target.head_dim, big_ok), label="case")
    exercised(FUSED_NORM, case.q_norm is not None)
    exercised(FUSED_BIG, case.store.big or not big_ok)
    kv_store.check_norm_rope_store(op_bench, case)
