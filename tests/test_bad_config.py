"""The bad-input catalogue, configuration part: EngineConfig, TPInfo, PageLayout and the StaticDriver constructor.

Every case asserts the typed error, that its message names the field, and that a valid generation on an engine
built before is bitwise the same afterwards (oracle.rejection.Contract). Numbers of any kind (NumPy scalars,
Fraction) are valid wherever a number is; bools only where a bool is.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine import ConfigError, Engine, EngineConfig, TPInfo
from engine.device import cpu_threads_for
from engine.driver import PageLayout, StaticDriver
from oracle.rejection import Contract, witness


@pytest.fixture(scope="module")
def contract(qwen3: Path) -> Iterator[Contract]:
    engine = Engine(EngineConfig(str(qwen3), device="cpu", num_page_override=64, max_running_req=4,
                                 max_seq_len_override=64), sampler_seed=0)
    yield Contract.of(engine)
    engine.shutdown()


def small(model: Path, **kwargs: Any) -> EngineConfig:
    return EngineConfig(str(model), **{"device": "cpu", "num_page_override": 8, "max_seq_len_override": 64, **kwargs})


# ---- EngineConfig: rejected when the config is built (a bad field fails even where this setup never reads it) ----
CONFIG_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("use_dummy_weight 'false'", {"use_dummy_weight": "false"}, ("use_dummy_weight='false'", "True or False")),
    ("use_dummy_weight 1", {"use_dummy_weight": 1}, ("use_dummy_weight=1",)),
    ("use_dummy_weight None", {"use_dummy_weight": None}, ("use_dummy_weight=None",)),
    ("use_dummy_weight np.bool_", {"use_dummy_weight": np.bool_(True)}, ("use_dummy_weight=",)),
    ("batch_invariant 'on'", {"batch_invariant": "on"}, ("batch_invariant='on'", "True or False")),
    ("batch_invariant None", {"batch_invariant": None}, ("batch_invariant=None",)),
    ("distributed_port 0", {"distributed_port": 0}, ("distributed_port=0", "[1, 65535]")),
    ("distributed_port 70000", {"distributed_port": 70000}, ("distributed_port=70000",)),
    ("distributed_port str", {"distributed_port": "2333"}, ("distributed_port='2333'",)),
    ("distributed_port float", {"distributed_port": 2333.0}, ("distributed_port=2333.0",)),
    ("distributed_port bool", {"distributed_port": True}, ("distributed_port=True",)),
    ("distributed_timeout 0", {"distributed_timeout": 0}, ("distributed_timeout=0",)),
    ("distributed_timeout negative", {"distributed_timeout": -5.0}, ("distributed_timeout=-5.0",)),
    ("distributed_timeout nan", {"distributed_timeout": math.nan}, ("distributed_timeout=nan",)),
    ("distributed_timeout inf", {"distributed_timeout": math.inf}, ("distributed_timeout=inf",)),
    ("distributed_timeout str", {"distributed_timeout": "60"}, ("distributed_timeout='60'",)),
    ("tp_info None", {"tp_info": None}, ("tp_info=None", "TPInfo")),
    ("tp_info tuple", {"tp_info": (0, 1)}, ("tp_info=(0, 1)",)),
    ("page_size bool", {"page_size": True}, ("page_size=True",)),
    ("page_size float", {"page_size": 2.0}, ("page_size=2.0",)),
    ("page_size str", {"page_size": "4"}, ("page_size='4'",)),
    ("page_size 0", {"page_size": 0}, ("page_size=0",)),
    ("page_size negative", {"page_size": -4}, ("page_size=-4",)),
    ("max_running_req 0", {"max_running_req": 0}, ("max_running_req=0",)),
    ("max_running_req np 0", {"max_running_req": np.int64(0)}, ("max_running_req=",)),
    ("max_running_req float", {"max_running_req": 4.5}, ("max_running_req=4.5",)),
    ("cpu_kv_cache_bytes 0", {"cpu_kv_cache_bytes": 0}, ("cpu_kv_cache_bytes=0",)),
    ("num_page_override 0", {"num_page_override": 0}, ("num_page_override=0",)),
    ("num_page_override str", {"num_page_override": "8"}, ("num_page_override='8'",)),
    ("max_seq_len_override negative", {"max_seq_len_override": -5}, ("max_seq_len_override=-5",)),
    ("cuda_graph_max_bs 0", {"cuda_graph_max_bs": 0}, ("cuda_graph_max_bs=0",)),
    ("cuda_graph_bs not a list", {"cuda_graph_bs": 4}, ("cuda_graph_bs=4",)),
    ("cuda_graph_bs str", {"cuda_graph_bs": "1,2"}, ("cuda_graph_bs='1,2'",)),
    ("cuda_graph_bs entry 0", {"cuda_graph_bs": [1, 0]}, ("cuda_graph_bs[1]=0",)),
    ("cuda_graph_bs entry str", {"cuda_graph_bs": [2, "4"]}, ("cuda_graph_bs[1]='4'",)),
    ("memory_ratio 0", {"memory_ratio": 0.0}, ("memory_ratio=0.0",)),
    ("memory_ratio > 1", {"memory_ratio": 1.5}, ("memory_ratio=1.5",)),
    ("memory_ratio nan", {"memory_ratio": math.nan}, ("memory_ratio=nan",)),
    ("memory_ratio str", {"memory_ratio": "0.9"}, ("memory_ratio='0.9'",)),
    ("memory_ratio bool", {"memory_ratio": True}, ("memory_ratio=True",)),
    ("unknown dtype", {"dtype": "int8"}, ("dtype='int8'",)),
    ("dtype an int", {"dtype": 5}, ("dtype=5",)),
    ("dtype torch.int32", {"dtype": torch.int32}, ("dtype=torch.int32",)),
    ("device not a string", {"device": None}, ("device=None",)),
    ("attention_backend not a string", {"attention_backend": 3}, ("attention_backend=3",)),
    ("sampler_backend not a string", {"sampler_backend": None}, ("sampler_backend=None",)),
    ("layer_kernels not a string", {"layer_kernels": ["torch"]}, ("layer_kernels=['torch']",)),
    ("moe_backend not a string", {"moe_backend": 0}, ("moe_backend=0",)),
]


@pytest.mark.parametrize("name,kwargs,needles", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_bad_config_field(
    contract: Contract, qwen3: Path, name: str, kwargs: dict[str, Any], needles: tuple[str, ...]
) -> None:
    threads = torch.get_num_threads()
    error = contract.rejects(ConfigError, lambda: small(qwen3, **kwargs), *needles)
    assert isinstance(error, ValueError)  # callers that catch ValueError keep working
    assert torch.get_num_threads() == threads


def test_model_path_not_a_path(contract: Contract) -> None:
    contract.rejects(ConfigError, lambda: EngineConfig(None), "model_path=None")  # type: ignore[arg-type]
    contract.rejects(ConfigError, lambda: EngineConfig(5), "model_path=5")  # type: ignore[arg-type]


# ---- values valid only on the engine: names the registry choices ----------------------------------------------
ENGINE_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("unknown device", {"device": "tpu"}, ("device='tpu'",)),
    ("unknown attention backend", {"attention_backend": "flash9"}, ("'flash9'", "torch")),
    ("unknown layer kernels", {"layer_kernels": "tritonn"}, ("'tritonn'",)),
    ("unknown sampler", {"sampler_backend": "fast"}, ("'fast'",)),
    ("unknown MoE backend", {"moe_backend": "deepep"}, ("'deepep'",)),
    ("float16 on CPU", {"dtype": "float16"}, ("float16", "CPU")),
    (
        "batch_invariant with kernels that are not invariant",
        {"batch_invariant": True, "layer_kernels": "triton_invariant"},
        ("batch_invariant=True on cpu", "layer_kernels='torch_invariant'", "got attention_backend='auto'"),
    ),
    (
        "batch_invariant with the reference's kernels",
        {"batch_invariant": True, "layer_kernels": "torch"},
        ("batch_invariant=True on cpu", "layer_kernels='torch_invariant'", "got attention_backend='auto'"),
    ),
    ("absent CUDA device", {"device": "cuda:7"}, ("cuda:7",)),
]


@pytest.mark.parametrize("name,kwargs,needles", ENGINE_CASES, ids=[c[0] for c in ENGINE_CASES])
def test_config_refused_by_the_engine(
    contract: Contract, qwen3: Path, name: str, kwargs: dict[str, Any], needles: tuple[str, ...]
) -> None:
    if name == "absent CUDA device" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    threads = torch.get_num_threads()
    contract.rejects(ConfigError, lambda: Engine(small(qwen3, **kwargs)), *needles)
    assert torch.get_num_threads() == threads


SEED_CASES: list[object] = [2**70, 2**63, -1, "7", 7.0, True]


@pytest.mark.parametrize("seed", SEED_CASES, ids=[repr(s) for s in SEED_CASES])
def test_bad_sampler_seed(contract: Contract, qwen3: Path, seed: object) -> None:
    """Checked like a request's seed: an int in [0, 2**63)."""
    build = lambda: Engine(small(qwen3), sampler_seed=seed)  # type: ignore[arg-type]  # noqa: E731
    contract.rejects(ConfigError, build, f"sampler_seed={seed!r}")


# ---- TPInfo --------------------------------------------------------------------------------------------------
TP_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("size 0", {"size": 0}, ("size=0",)),
    ("rank == size", {"rank": 1, "size": 1}, ("rank=1", "[0, size=1)")),
    ("negative rank", {"rank": -1, "size": 2}, ("rank=-1",)),
    ("float rank", {"rank": 0.5, "size": 2}, ("rank=0.5",)),
    ("bool size", {"size": True}, ("size=True",)),
    ("str size", {"size": "2"}, ("size='2'",)),
]


@pytest.mark.parametrize("name,kwargs,needles", TP_CASES, ids=[c[0] for c in TP_CASES])
def test_bad_tp_info(contract: Contract, name: str, kwargs: dict[str, Any], needles: tuple[str, ...]) -> None:
    error = contract.rejects(ConfigError, lambda: TPInfo(**kwargs), "TPInfo", *needles)
    assert isinstance(error, ValueError)


# ---- the driver's constructor and its page layout --------------------------------------------------------------
DRIVER_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("layout a string", {"layout": "shuffled"}, ("layout='shuffled'", "PageLayout")),
    ("max_prefill_tokens 0", {"max_prefill_tokens": 0}, ("max_prefill_tokens=0",)),
    ("max_prefill_tokens float", {"max_prefill_tokens": 1.5}, ("max_prefill_tokens=1.5",)),
    ("max_prefill_tokens bool", {"max_prefill_tokens": True}, ("max_prefill_tokens=True",)),
    ("record_logits str", {"record_logits": "yes"}, ("record_logits='yes'",)),
    ("record_logits None", {"record_logits": None}, ("record_logits=None",)),
    ("eos_token_ids an int", {"eos_token_ids": 5}, ("eos_token_ids=5",)),
    ("eos_token_ids a str", {"eos_token_ids": "12"}, ("eos_token_ids='12'",)),
    ("eos_token_ids of str", {"eos_token_ids": ["a"]}, ("eos_token_ids=['a']",)),
    ("eos_token_ids of floats", {"eos_token_ids": [1.0]}, ("eos_token_ids=[1.0]",)),
]


@pytest.mark.parametrize("name,kwargs,needles", DRIVER_CASES, ids=[c[0] for c in DRIVER_CASES])
def test_bad_driver_argument(contract: Contract, name: str, kwargs: dict[str, Any], needles: tuple[str, ...]) -> None:
    driver = StaticDriver(contract.engine)
    contract.rejects(ConfigError, lambda: StaticDriver(contract.engine, **kwargs), *needles, driver=driver)


LAYOUT_CASES: list[tuple[str, dict[str, Any], tuple[str, ...]]] = [
    ("misspelt kind", {"kind": "shuffle"}, ("kind='shuffle'", "shuffled")),
    ("kind in capitals", {"kind": "Contiguous"}, ("kind='Contiguous'",)),
    ("kind None", {"kind": None}, ("kind=None",)),
    ("seed a str", {"seed": "1"}, ("seed='1'",)),
    ("seed a float", {"seed": 1.5}, ("seed=1.5",)),
]


@pytest.mark.parametrize("name,kwargs,needles", LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
def test_bad_page_layout(contract: Contract, name: str, kwargs: dict[str, Any], needles: tuple[str, ...]) -> None:
    contract.rejects(ConfigError, lambda: PageLayout(**kwargs), "PageLayout", *needles)


# ---- valid input of other types --------------------------------------------------------------------------------
def test_numpy_and_fraction_config_values_are_accepted(qwen3: Path) -> None:
    plain = small(qwen3, page_size=2, max_running_req=4, memory_ratio=0.5)
    odd = small(qwen3, page_size=np.int32(2), max_running_req=np.int64(4), memory_ratio=Fraction(1, 2),
                num_page_override=np.uint8(8), distributed_port=np.int16(2333), distributed_timeout=np.float32(60),
                cuda_graph_bs=[np.int64(1), 2], tp_info=TPInfo(np.int64(0), np.int8(1)))
    for name in ("page_size", "max_running_req", "num_page_override", "distributed_port"):
        assert type(getattr(odd, name)) is int, name
    assert type(odd.memory_ratio) is float and odd.cuda_graph_bs == [1, 2]
    assert type(odd.tp_info.rank) is int and odd.tp_info == TPInfo()
    engines = [Engine(plain, sampler_seed=0), Engine(odd, sampler_seed=0)]
    try:
        witness(engines[0]).assert_equal(witness(engines[1]))
    finally:
        for engine in engines:
            engine.shutdown()


def test_engines_shut_down_in_any_order_restore_the_thread_count(
    qwen3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # else the engines leave the thread count alone
    threads = torch.get_num_threads()
    found = (cpu_threads_for(1) or 1) + 1  # not what the engines set, so a wrong restore shows
    torch.set_num_threads(found)
    try:
        first, second, third = (Engine(small(qwen3)) for _ in range(3))
        assert torch.get_num_threads() == found - 1
        for engine in (first, third, second):
            engine.shutdown()
        assert torch.get_num_threads() == found
    finally:
        torch.set_num_threads(threads)
