"""The layer- and step-kernel registries: name resolution, errors, and that every layer dispatches through
ctx.kernels and every step's slot check through the engine's step kernels."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.config import INVARIANT_BACKENDS
from engine.driver import StaticDriver
from engine.errors import ConfigError
from engine.layers.kernels import LAYER_KERNELS, TORCH_KERNELS, InvariantKernels, LayerKernels, TorchKernels
from engine.registry import Registry, Where
from engine.step.kernels import STEP_KERNELS, TorchStepKernels
from oracle.zoo import tiny_model_dir

CPU = Where(torch.device("cpu"), torch.float32, 16)


REGISTRIES = pytest.mark.parametrize("registry", [LAYER_KERNELS, STEP_KERNELS], ids=["layer", "step"])


@REGISTRIES
def test_auto_is_torch_on_cpu(registry: Registry[Any]) -> None:
    assert registry.resolve("auto", CPU) == "torch"


@REGISTRIES
@pytest.mark.parametrize(
    ("name", "message"), [("triton", "needs a CUDA device"), ("cutlass", "unknown; known: auto, torch")]
)
def test_bad_names_are_config_errors(registry: Registry[Any], name: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        registry.resolve(name, CPU)


@pytest.mark.parametrize("field", ["layer_kernels", "step_kernels"])
def test_engine_config_rejects_non_string(tmp_path: Path, field: str) -> None:
    with pytest.raises(ConfigError, match=f"{field}=3 is invalid"):
        EngineConfig(str(tmp_path), **{field: 3})


class CountingKernels(TorchKernels):
    """The torch reference, counting each call: proves which layer ops go through the context's kernels."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def rms_norm(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls["rms_norm"] += 1
        return super().rms_norm(*args, **kwargs)

    def norm_rope(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls["norm_rope"] += 1
        return super().norm_rope(*args, **kwargs)

    def silu_and_mul(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls["silu_and_mul"] += 1
        return super().silu_and_mul(*args, **kwargs)

    def linear(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls["linear"] += 1
        return super().linear(*args, **kwargs)

    def store_kv(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls["store_kv"] += 1
        return super().store_kv(*args, **kwargs)

    def norm_rope_store(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls["norm_rope_store"] += 1
        return super().norm_rope_store(*args, **kwargs)



class CountingStepKernels(TorchStepKernels):
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()

    def slot_check(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls["slot_check"] += 1
        return super().slot_check(*args, **kwargs)


def _engine(model: Path, **fields: Any) -> Engine:
    config = EngineConfig(str(model), device="cpu", max_running_req=2, num_page_override=64, **fields)
    return Engine(config, sampler_seed=0)


def _generate(engine: Engine) -> list[int]:
    return StaticDriver(engine).generate([[1, 2, 3, 4]], SamplingParams(max_tokens=3, ignore_eos=True))[0].output_ids


def test_every_layer_dispatches_through_the_context_kernels(tmp_path: Path) -> None:
    model = tiny_model_dir("qwen3", tmp_path)
    engine, other = _engine(model), _engine(model)
    reference = _generate(engine)
    counting, counting_step = CountingKernels(), CountingStepKernels()
    engine.ctx.kernels, engine.step_kernels = counting, counting_step
    again = _generate(engine)
    untouched = _generate(other)  # another engine in the process keeps its own kernels
    assert other.ctx.kernels is TORCH_KERNELS
    engine.shutdown()
    other.shutdown()
    layers = engine.model_config.num_layers
    steps = 3  # one prefill, two decodes
    # Per layer and step: input and post-attention norms, q and k norm+rope with the KV store (one norm_rope_store,
    # which the reference composes of norm_rope twice and store_kv), one MLP; plus the final norm per step; the q/k
    # norms run inside norm_rope (qwen3), through the same kernels; four projections (qkv, o, gate_up, down:
    # SiLU-and-mul runs inside the gated down_proj) and the LM head; one slot check per step.
    assert counting_step.calls == {"slot_check": steps}
    assert counting.calls == {
        "rms_norm": steps * (4 * layers + 1),
        "norm_rope": steps * 2 * layers,
        "silu_and_mul": steps * layers,
        "linear": steps * (4 * layers + 1),
        "store_kv": steps * layers,
        "norm_rope_store": steps * layers,
    }
    assert again == reference == untouched


def test_the_interface_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        LayerKernels()  # type: ignore[abstract]
    assert isinstance(TORCH_KERNELS, TorchKernels) and LAYER_KERNELS.factory("torch")() is TORCH_KERNELS


def test_batch_invariant_takes_its_layer_kernels_from_the_registry(tmp_path: Path) -> None:
    """On CPU batch_invariant names 'torch_invariant' (INVARIANT_BACKENDS), which the engine builds through
    LAYER_KERNELS like any other name; naming it without batch_invariant is allowed, as 'triton_invariant' is."""
    assert INVARIANT_BACKENDS["cpu"][1] == "torch_invariant"
    assert isinstance(LAYER_KERNELS.factory("torch_invariant")(), InvariantKernels)
    model = tiny_model_dir("qwen3", tmp_path)
    named = _engine(model, layer_kernels="torch_invariant")
    assert isinstance(named.ctx.kernels, InvariantKernels) and not named.config.batch_invariant
    named.shutdown()
    registered, original = CountingKernels(), LAYER_KERNELS.factory("torch_invariant")
    LAYER_KERNELS.register("torch_invariant", lambda: registered, replace=True)
    try:
        engine = _engine(model, batch_invariant=True)
    finally:
        LAYER_KERNELS.register("torch_invariant", original, replace=True)
    assert engine.ctx.kernels is registered
    engine.shutdown()
