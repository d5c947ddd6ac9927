"""The bad-model-directory catalogue: every broken config.json, generation_config.json, index, shard or tensor makes
the Engine constructor raise ModelLoadError naming the key, file or tensor, and leaves the process as it was
(oracle.rejection's contract: the torch thread count, and a valid generation on an engine already built, bitwise
equal before and after).

Sharded cases split the tiny qwen3's tensors into two files with a ``model.safetensors.index.json``, as HF's
save_pretrained does for large models; the valid cases check that such a checkpoint loads exactly the same weights,
and that the EOS ids the engine stops on are the ones transformers loads for HF's generate.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import Engine, EngineConfig, ModelLoadError, SamplingParams
from engine.driver import StaticDriver
from engine.models import ModelConfig, supported_architectures
from oracle.rejection import expect, witness

INDEX = "model.safetensors.index.json"
SHARDS = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
Breakage = Callable[[Path], object]
Case = tuple[str, Breakage, tuple[str, ...]]  # name, breakage, what the message must name


def _config(model: Path, **kwargs: Any) -> EngineConfig:
    return EngineConfig(str(model), **{"device": "cpu", "num_page_override": 8, **kwargs})


@pytest.fixture(scope="module")
def good(qwen3: Path) -> Iterator[Engine]:
    """A valid engine, built once: its generations must not change when another engine fails to build."""
    eng = Engine(_config(qwen3, num_page_override=32, max_running_req=2))
    yield eng
    eng.shutdown()


def _copy(qwen3: Path, tmp_path: Path) -> Path:
    model = tmp_path / "model"
    shutil.copytree(qwen3, model)
    return model


def assert_rejected(good: Engine, model: Path, *needles: str) -> None:
    before, threads = witness(good), torch.get_num_threads()
    expect(ModelLoadError, lambda: Engine(_config(model)), *needles)
    assert torch.get_num_threads() == threads, "a failed constructor changed the thread count"
    witness(good).assert_equal(before)


# ---- model directories ---------------------------------------------------------------------------------------
def _with_config(edit: Callable[[dict[str, Any]], object]) -> Breakage:
    def apply(d: Path) -> None:
        cfg = json.loads((d / "config.json").read_text())
        edit(cfg)
        (d / "config.json").write_text(json.dumps(cfg))

    return apply


def _edit_config(**changes: Any) -> Breakage:
    return _with_config(lambda cfg: cfg.update(changes))


def _edit_tensors(edit: Callable[[dict[str, torch.Tensor]], object], file: str = "model.safetensors") -> Breakage:
    def apply(d: Path) -> None:
        tensors = load_file(d / file)
        edit(tensors)
        save_file(tensors, d / file)

    return apply


def _truncate(keep: Callable[[int], int]) -> Breakage:
    def apply(d: Path) -> None:
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[: keep(len(data))])

    return apply


def _corrupt_header(d: Path) -> None:
    data = bytearray((d / "model.safetensors").read_bytes())
    data[8:24] = b"\xff" * 16  # inside the JSON header
    (d / "model.safetensors").write_bytes(bytes(data))


K0 = "model.layers.0.self_attn.k_proj.weight"
Q0_BIAS = "model.layers.0.self_attn.q_proj.bias"  # qwen3 has no attention bias
MODEL_DIR_CASES: list[Case] = [
    ("missing config.json", lambda d: (d / "config.json").unlink(), ("no config.json",)),
    ("config.json not JSON", lambda d: (d / "config.json").write_text("{oops"), ("not valid JSON",)),
    ("config.json a list", lambda d: (d / "config.json").write_text("[1]"), ("JSON object", "list")),
    ("config lacks a key", lambda d: _drop_config_key(d, "hidden_size"), ("'hidden_size'",)),
    ("zero attention heads", _edit_config(num_attention_heads=0), ("num_attention_heads=0",)),
    ("negative vocab", _edit_config(vocab_size=-1), ("vocab_size=-1",)),
    ("unsupported architecture", _edit_config(architectures=["GPT2LMHeadModel"]),
     ("'GPT2LMHeadModel'", *supported_architectures())),
    ("architectures a string", _edit_config(architectures="Qwen3ForCausalLM"), ("'architectures'",)),
    ("unsupported rope type", _edit_config(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}), ("'yarn'",)),
    ("no safetensors", lambda d: (d / "model.safetensors").unlink(), ("no *.safetensors",)),
    ("missing tensor", _edit_tensors(lambda t: t.pop("model.norm.weight")), ("missing", "model.norm.weight")),
    ("missing merged shard", _edit_tensors(lambda t: t.pop(K0)), ("missing", K0)),
    ("unexpected tensor", _edit_tensors(lambda t: t.update({"model.extra.weight": torch.zeros(2)})),
     ("unexpected tensor 'model.extra.weight'",)),
    ("bias the arch lacks", _edit_tensors(lambda t: t.update({Q0_BIAS: torch.zeros(64)})), (f"'{Q0_BIAS}'",)),
    ("wrong-shape tensor", _edit_tensors(lambda t: t.update({K0: torch.zeros(16, 64)})),
     (K0, "(16, 64)", "(32, 64)")),
    ("truncated to half", _truncate(lambda n: n // 2), ("model.safetensors", "not a readable safetensors")),
    ("data section cut short", _truncate(lambda n: n - 100), ("model.safetensors", "not a readable safetensors")),
    ("empty safetensors", _truncate(lambda n: 0), ("model.safetensors",)),
    ("corrupt header", _corrupt_header, ("model.safetensors", "not a readable safetensors")),
]


def _drop_config_key(d: Path, key: str) -> None:
    _with_config(lambda cfg: cfg.pop(key))(d)


# ---- config.json values --------------------------------------------------------------------------------------
LLAMA3 = {"rope_type": "llama3", "rope_theta": 1e6, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def _bad_value(key: str, value: Any) -> Case:
    """config.json with key=value: rejected, naming both."""
    return f"{key}={value!r}", _edit_config(**{key: value}), (f"config.json: {key}={value!r} is invalid",)


def _bad_rope(key: str, value: Any, base: dict[str, Any] | None = None) -> Case:
    """rope_parameters (the tiny model's, or `base`) with key=value."""
    edit = _with_config(lambda cfg: cfg.update(rope_parameters={**(base or cfg["rope_parameters"]), key: value}))
    kind = "llama3 " if base else ""
    needle = f"config.json: rope_parameters.{key}={value!r} is invalid"
    return f"{kind}rope_parameters.{key}={value!r}", edit, (needle,)


def _transformers4(theta: Any, scaling: dict[str, Any] | None = None) -> Breakage:
    """The rope settings in transformers-4 form: rope_theta at the top level, scaling in rope_scaling."""
    return _with_config(lambda cfg: (cfg.pop("rope_parameters"), cfg.update(rope_theta=theta, rope_scaling=scaling)))


_V4_LLAMA3 = {k: v for k, v in LLAMA3.items() if k != "rope_theta"}
CONFIG_CASES: list[Case] = [
    # finite numbers > 0 (json writes and reads NaN and Infinity, as Python's own configs may hold them)
    _bad_value("rms_norm_eps", 0),
    _bad_value("rms_norm_eps", -1e-6),
    _bad_value("rms_norm_eps", math.nan),
    _bad_value("rms_norm_eps", math.inf),
    _bad_value("rms_norm_eps", "1e-6"),
    _bad_value("rms_norm_eps", True),
    _bad_rope("rope_theta", 0),
    _bad_rope("rope_theta", -1e6),
    _bad_rope("rope_theta", math.inf),
    _bad_rope("rope_theta", "1e6"),
    ("top-level rope_theta=0", _transformers4(0), ("config.json: rope_theta=0 is invalid",)),
    ("top-level rope_theta=nan", _transformers4(math.nan), ("config.json: rope_theta=nan is invalid",)),
    ("top-level rope_theta=True", _transformers4(True), ("config.json: rope_theta=True is invalid",)),
    # llama3 scaling
    _bad_rope("factor", 0, LLAMA3),
    _bad_rope("factor", -8.0, LLAMA3),
    _bad_rope("factor", math.nan, LLAMA3),
    _bad_rope("low_freq_factor", 0.0, LLAMA3),
    _bad_rope("high_freq_factor", -4.0, LLAMA3),
    _bad_rope("high_freq_factor", "4", LLAMA3),
    _bad_rope("high_freq_factor", 1.0, LLAMA3),  # equal to low_freq_factor: the blend divides by the difference
    _bad_rope("original_max_position_embeddings", 0, LLAMA3),
    _bad_rope("original_max_position_embeddings", 8192.5, LLAMA3),
    _bad_rope("original_max_position_embeddings", "8192", LLAMA3),
    ("llama3 without factor", _bad_rope("factor", None, LLAMA3)[1],
     ("lacks the required key 'rope_parameters.factor'",)),
    ("transformers-4 llama3 factor=0", _transformers4(1e4, {**_V4_LLAMA3, "factor": 0}),
     ("config.json: rope_scaling.factor=0 is invalid",)),
    # JSON booleans
    _bad_value("tie_word_embeddings", "false"),
    _bad_value("tie_word_embeddings", 1),
    _bad_value("tie_word_embeddings", 0),
    _bad_value("attention_bias", "false"),
    _bad_value("attention_bias", 1),
    _bad_value("norm_topk_prob", "yes"),
    # integers: not truncated, parsed or read from a bool
    _bad_value("hidden_size", 64.5),
    _bad_value("hidden_size", "64"),
    _bad_value("hidden_size", True),
    _bad_value("num_hidden_layers", 2.0),
    _bad_value("num_attention_heads", True),
    _bad_value("vocab_size", "512"),
    _bad_value("intermediate_size", 128.5),
    _bad_value("num_key_value_heads", 0),  # was silently replaced by num_attention_heads
    _bad_value("num_key_value_heads", 2.0),
    _bad_value("max_position_embeddings", 0),
    _bad_value("max_position_embeddings", "1024"),
    _bad_value("head_dim", 0),  # was silently replaced by hidden_size // num_attention_heads
    _bad_value("head_dim", -16),
    _bad_value("head_dim", 15),  # rotary embedding rotates pairs of dimensions
    _bad_value("head_dim", 1),
    _bad_value("head_dim", 16.0),
    _bad_value("head_dim", True),
    ("derived head_dim 0", _edit_config(head_dim=None, hidden_size=2), ("config.json: head_dim=0 is invalid",)),
    _bad_value("num_experts", 2.5),
    _bad_value("num_experts", -1),
    _bad_value("num_experts_per_tok", "2"),
    _bad_value("decoder_sparse_step", 0),
    ("required key null", _edit_config(hidden_size=None), ("lacks the required key 'hidden_size'",)),
    # lists of ints
    _bad_value("mlp_only_layers", [2]),  # the tiny model has layers 0 and 1
    _bad_value("mlp_only_layers", [-1]),
    _bad_value("mlp_only_layers", [0.5]),
    _bad_value("mlp_only_layers", [True]),
    _bad_value("mlp_only_layers", "0"),
    _bad_value("eos_token_id", "1"),
    _bad_value("eos_token_id", 1.5),
    _bad_value("eos_token_id", -1),
    _bad_value("eos_token_id", True),
    _bad_value("eos_token_id", [1, "2"]),
    _bad_value("eos_token_id", [[1]]),
    _bad_value("eos_token_id", 512),  # the tiny vocabulary is 0..511
    _bad_value("eos_token_id", 2**64),
    ("config.json not UTF-8", lambda d: (d / "config.json").write_bytes(b'{"vocab_size": "\xff"}'),
     ("config.json", "not UTF-8")),
    # past float range (float() overflows) or torch's int64 sizes
    ("rms_norm_eps of 400 digits", *_bad_value("rms_norm_eps", 10**400)[1:]),
    ("rope_theta of 400 digits", *_bad_rope("rope_theta", 10**400)[1:]),
    ("top-level rope_theta of 400 digits", _transformers4(10**400), ("config.json: rope_theta=1000",)),
    _bad_value("vocab_size", 2**62),
    _bad_value("hidden_size", 2**31),
    # more parameters than the weight files can hold: refused by arithmetic, before any layer is built
    ("a vocabulary the checkpoint cannot hold", _edit_config(vocab_size=2**30),
     ("config.json", "vocab_size=1073741824", "bytes of model.safetensors")),
    ("layers the checkpoint cannot hold", _edit_config(num_hidden_layers=64),
     ("config.json", "num_hidden_layers=64", "bytes of model.safetensors")),
]


# ---- generation_config.json ----------------------------------------------------------------------------------
GEN = "generation_config.json"


def _gen_text(text: str | bytes) -> Breakage:
    data = text.encode() if isinstance(text, str) else text
    return lambda d: (d / GEN).write_bytes(data)


def _bad_gen_eos(value: Any) -> Case:
    """generation_config.json with eos_token_id=value: rejected, naming the file, the key and the value."""
    return f"{GEN} eos_token_id={value!r}", _gen_text(json.dumps({"eos_token_id": value})), (
        f"{GEN}: eos_token_id={value!r} is invalid",
    )


def _gen_a_directory(d: Path) -> None:
    (d / GEN).unlink()
    (d / GEN).mkdir()


def _gen_a_dangling_link(d: Path) -> None:
    (d / GEN).unlink()
    (d / GEN).symlink_to(d / "no-such-file.json")


GENERATION_CONFIG_CASES: list[Case] = [
    (f"{GEN} not JSON", _gen_text("{oops"), (GEN, "not valid JSON")),
    (f"{GEN} not UTF-8", _gen_text(b'{"eos_token_id": "\xff"}'), (GEN, "not UTF-8")),
    (f"{GEN} a list", _gen_text("[1]"), (GEN, "JSON object", "list")),
    (f"{GEN} a string", _gen_text('"eos"'), (GEN, "JSON object", "str")),
    (f"{GEN} a directory", _gen_a_directory, (GEN, "not a regular file")),
    (f"{GEN} a dangling link", _gen_a_dangling_link, (GEN, "not a regular file")),
    _bad_gen_eos(-1),
    _bad_gen_eos([1, -2]),
    _bad_gen_eos("1"),
    _bad_gen_eos(["1"]),
    _bad_gen_eos(1.0),
    _bad_gen_eos([1, 2.5]),
    _bad_gen_eos(True),
    _bad_gen_eos([1, False]),
    _bad_gen_eos([[1]]),
    _bad_gen_eos({"id": 1}),
    _bad_gen_eos(512),
    _bad_gen_eos(2**64),
    _bad_gen_eos([1, 10**30]),
]


# ---- sharded checkpoints and duplicate tensors ---------------------------------------------------------------
def _shard_of(name: str) -> str:
    # Layer 1 and every k_proj in the second file: layer 0's q/k/v merge across the two files.
    return SHARDS[1] if ".layers.1." in name or "k_proj" in name else SHARDS[0]


def _split(d: Path) -> dict[str, str]:
    """Move model.safetensors' tensors into SHARDS (no index); returns tensor → file."""
    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    weight_map = {name: _shard_of(name) for name in sorted(tensors)}
    for file in SHARDS:
        save_file({n: t for n, t in tensors.items() if weight_map[n] == file}, d / file, metadata={"format": "pt"})
    return weight_map


def _write_index(d: Path, weight_map: Any) -> None:
    (d / INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def _shard(d: Path) -> dict[str, str]:
    weight_map = _split(d)
    _write_index(d, weight_map)
    return weight_map


def _sharded(edit: Callable[[Path, dict[str, str]], object]) -> Breakage:
    """Shard the checkpoint with an index, then break it with edit(dir, weight_map)."""

    def apply(d: Path) -> None:
        edit(d, _shard(d))

    return apply


def _remap(name: str, file: str | None) -> Breakage:
    """The index maps `name` to `file` (None: leaves it out) while the tensor stays where it was."""

    def edit(d: Path, weight_map: dict[str, str]) -> None:
        if file is None:
            del weight_map[name]
        else:
            weight_map[name] = file
        _write_index(d, weight_map)

    return _sharded(edit)


def _in_shard(file: str, edit: Callable[[dict[str, torch.Tensor]], object]) -> Breakage:
    return _sharded(lambda d, _: _edit_tensors(edit, file)(d))


def _index_text(text: str) -> Breakage:
    return _sharded(lambda d, _: (d / INDEX).write_text(text))


def _copy_tensor_into(file: str, name: str) -> Breakage:
    """A second copy of model.safetensors' `name`, in a new file."""
    return lambda d: save_file({name: load_file(d / "model.safetensors")[name]}, d / file)


NORM = "model.norm.weight"  # in SHARDS[0]
V1 = "model.layers.1.self_attn.v_proj.weight"  # in SHARDS[1]


def _index_is_a_directory(d: Path, _: dict[str, str]) -> None:
    (d / INDEX).unlink()
    (d / INDEX).mkdir()


def _extra_tensor_in_shard(d: Path, weight_map: dict[str, str]) -> None:
    """A tensor the architecture lacks, in the second shard and listed there by the index."""
    _edit_tensors(lambda t: t.update({"model.extra.weight": torch.zeros(2)}), SHARDS[1])(d)
    _write_index(d, {**weight_map, "model.extra.weight": SHARDS[1]})


def _move_shard_out(d: Path, weight_map: dict[str, str], name: str) -> None:
    """SHARDS[1], valid, moved next to the model directory, and the index mapping its tensors to `name`."""
    (d / SHARDS[1]).rename(d.parent / SHARDS[1])
    _write_index(d, {t: name if f == SHARDS[1] else f for t, f in weight_map.items()})


def _split_with_a_copy(d: Path) -> None:
    """The split without an index, and the final norm in both files."""
    _split(d)
    _edit_tensors(lambda t: t.update({NORM: torch.ones(64)}), SHARDS[1])(d)


INDEX_CASES: list[Case] = [
    ("index not JSON", _index_text("{oops"), (INDEX, "not valid JSON")),
    ("index not UTF-8", _sharded(lambda d, _: (d / INDEX).write_bytes(b'{"weight_map": "\xff"}')),
     (INDEX, "not UTF-8")),
    ("index a list", _index_text("[1]"), (INDEX, "'weight_map'")),
    ("index without weight_map", _index_text('{"metadata": {}}'), (INDEX, "'weight_map'")),
    ("weight_map a list", _sharded(lambda d, m: _write_index(d, sorted(m))), (INDEX, "'weight_map'")),
    ("weight_map value not a string", _sharded(lambda d, m: _write_index(d, {**m, NORM: 3})), (INDEX, NORM, "3")),
    ("index a directory", _sharded(_index_is_a_directory), (INDEX,)),
    ("empty weight_map", _sharded(lambda d, _: _write_index(d, {})), (INDEX, "non-empty 'weight_map'")),
    ("shard file missing", _sharded(lambda d, _: (d / SHARDS[1]).unlink()),
     (INDEX, SHARDS[1], "not a regular file")),
    ("index names a misspelt file", _remap(NORM, "model-00003-of-00002.safetensors"),
     (INDEX, "model-00003-of-00002.safetensors", "not a regular file")),
    ("tensor missing from its shard", _in_shard(SHARDS[0], lambda t: t.pop(NORM)), (INDEX, NORM, SHARDS[0])),
    ("merged shard missing from its file", _in_shard(SHARDS[1], lambda t: t.pop(K0)), (INDEX, K0, SHARDS[1])),
    ("tensor in the first shard, mapped to the second", _remap(NORM, SHARDS[1]), (NORM, SHARDS[0], SHARDS[1])),
    ("tensor in the second shard, mapped to the first", _remap(V1, SHARDS[0]), (V1, SHARDS[0], "no such tensor")),
    ("tensor the index leaves out", _remap(NORM, None), (NORM, SHARDS[0], "does not list it")),
    ("tensor in both shards", _in_shard(SHARDS[1], lambda t: t.update({NORM: torch.ones(64)})),
     (NORM, SHARDS[1], f"maps it to {SHARDS[0]}")),
    ("unexpected tensor in a shard", _sharded(_extra_tensor_in_shard),
     ("unexpected tensor 'model.extra.weight'", SHARDS[1])),
    ("wrong-shape tensor in a shard", _in_shard(SHARDS[1], lambda t: t.update({K0: torch.zeros(16, 64)})),
     (K0, "(16, 64)", "(32, 64)")),
    ("truncated shard", _sharded(lambda d, _: (d / SHARDS[1]).write_bytes((d / SHARDS[1]).read_bytes()[:100])),
     (SHARDS[1], "not a readable safetensors")),
    ("index names a file above the directory", _sharded(lambda d, m: _move_shard_out(d, m, f"../{SHARDS[1]}")),
     (INDEX, f"'../{SHARDS[1]}'", "outside the model directory")),
    ("index names an absolute path", _sharded(lambda d, m: _move_shard_out(d, m, str(d.parent / SHARDS[1]))),
     (INDEX, str(SHARDS[1]), "outside the model directory")),
]
DUPLICATE_CASES: list[Case] = [
    ("tensor also in a second file", _copy_tensor_into("extra.safetensors", K0),
     (K0, "extra.safetensors", "model.safetensors", "in both")),
    ("tensor in a file sorted first", _copy_tensor_into("a.safetensors", NORM),
     (NORM, "a.safetensors", "model.safetensors", "in both")),
    ("split checkpoint, no index, a tensor in both", _split_with_a_copy, (NORM, SHARDS[0], SHARDS[1], "in both")),
]


# ---- tensor dtypes -------------------------------------------------------------------------------------------
def _retyped(name: str, dtype: torch.dtype) -> Case:
    """model.safetensors with `name` cast to `dtype`: rejected, naming both."""
    return f"{dtype} weight", _edit_tensors(lambda t: t.update({name: t[name].to(dtype)})), (name, str(dtype))


UP1 = "model.layers.1.mlp.up_proj.weight"  # a shard of the merged gate_up_proj
DTYPE_CASES: list[Case] = [
    _retyped(K0, torch.int64),
    _retyped(NORM, torch.int32),
    _retyped(UP1, torch.int16),
    _retyped(K0, torch.int8),
    _retyped(NORM, torch.uint8),
    _retyped(NORM, torch.bool),
    ("int weight in a shard", _in_shard(SHARDS[1], lambda t: t.update({V1: t[V1].to(torch.int32)})),
     (V1, SHARDS[1], "torch.int32")),
]

BROKEN = MODEL_DIR_CASES + CONFIG_CASES + GENERATION_CONFIG_CASES + INDEX_CASES + DUPLICATE_CASES + DTYPE_CASES


@pytest.mark.parametrize("name,breakage,needles", BROKEN, ids=[c[0] for c in BROKEN])
def test_broken_model_dir(
    good: Engine, qwen3: Path, tmp_path: Path, name: str, breakage: Breakage, needles: tuple[str, ...]
) -> None:
    broken = _copy(qwen3, tmp_path)
    breakage(broken)
    assert_rejected(good, broken, *needles)


def _fifo(name: str, shard: bool = False) -> Breakage:
    """`name` a named pipe: opened for reading, it blocks until a writer comes."""

    def apply(d: Path) -> None:
        if shard:
            _shard(d)
        (d / name).unlink()
        os.mkfifo(d / name)

    return apply


def _device_link(d: Path) -> None:
    """model.safetensors a link to a character device that never ends."""
    (d / "model.safetensors").unlink()
    (d / "model.safetensors").symlink_to("/dev/zero")


# Each would block the load forever, or stall it for minutes; refused by stat or arithmetic before any open or build.
UNBOUNDED_CASES: list[Case] = [
    ("model.safetensors a FIFO", _fifo("model.safetensors"), ("'model.safetensors'", "not a regular file")),
    ("shard a FIFO", _fifo(SHARDS[1], shard=True), (SHARDS[1], "not a regular file", INDEX)),
    ("index a FIFO", _fifo(INDEX, shard=True), (INDEX, "not a regular file")),
    ("model.safetensors a device", _device_link, ("'model.safetensors'", "not a regular file")),
    ("a million layers", _edit_config(num_hidden_layers=1_000_000),
     ("config.json", "num_hidden_layers=1000000", "bytes of model.safetensors")),
    ("10**30 layers", _edit_config(num_hidden_layers=10**30), (f"config.json: num_hidden_layers={10**30} is invalid",)),
]


@pytest.mark.parametrize("name,breakage,needles", UNBOUNDED_CASES, ids=[c[0] for c in UNBOUNDED_CASES])
def test_refused_in_bounded_time(
    good: Engine, qwen3: Path, tmp_path: Path, name: str, breakage: Breakage, needles: tuple[str, ...]
) -> None:
    broken = _copy(qwen3, tmp_path)
    breakage(broken)
    failure: list[BaseException] = []

    def reject() -> None:
        try:
            assert_rejected(good, broken, *needles)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            failure.append(e)

    # A daemon thread: a regression that blocks fails the test instead of hanging the run.
    worker = threading.Thread(target=reject, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the load did not return within 60 s"
    if failure:
        raise failure[0]


def test_model_path_not_a_directory(good: Engine, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    assert_rejected(good, missing, str(missing), "not a directory")


def test_failed_construction_leaves_thread_count(qwen3: Path, tmp_path: Path) -> None:
    broken = _copy(qwen3, tmp_path)
    (broken / "model.safetensors").unlink()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        expect(ModelLoadError, lambda: Engine(_config(broken)), "no *.safetensors")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)


# ---- valid directories ---------------------------------------------------------------------------------------
def assert_loads_like(good: Engine, model: Path) -> None:
    """model builds an engine with the good engine's weights, bit for bit, and the same generations."""
    eng = Engine(_config(model, num_page_override=32, max_running_req=2))
    try:
        got, want = dict(eng.model.named_parameters()), dict(good.model.named_parameters())
        assert got.keys() == want.keys()
        assert all(torch.equal(got[n], want[n]) for n in want), "a weight loaded differently"
        witness(eng).assert_equal(witness(good))
    finally:
        eng.shutdown()


def test_sharded_checkpoint_loads_like_the_single_file(good: Engine, qwen3: Path, tmp_path: Path) -> None:
    model = _copy(qwen3, tmp_path)
    _shard(model)
    assert_loads_like(good, model)


def test_shards_linked_into_a_blobs_dir_load(good: Engine, qwen3: Path, tmp_path: Path) -> None:
    """HF's cache layout: the directory holds links to files elsewhere; links the directory holds are its files."""
    model = _copy(qwen3, tmp_path)
    _shard(model)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for file in (*SHARDS, INDEX):
        (model / file).rename(blobs / file)
        (model / file).symlink_to(Path("..") / "blobs" / file)
    assert_loads_like(good, model)


def test_split_checkpoint_without_index_loads(good: Engine, qwen3: Path, tmp_path: Path) -> None:
    model = _copy(qwen3, tmp_path)
    _split(model)
    assert_loads_like(good, model)


def test_index_ignores_a_stray_safetensors_file(good: Engine, qwen3: Path, tmp_path: Path) -> None:
    model = _copy(qwen3, tmp_path)
    weights = load_file(qwen3 / "model.safetensors")
    _shard(model)
    # Zeroed copies of every weight: read, they would clash with the shards or change the generations.
    save_file({n: torch.zeros_like(t) for n, t in weights.items()}, model / "consolidated.safetensors")
    assert_loads_like(good, model)
    (model / INDEX).unlink()  # without the index the stray file loads, and clashes
    assert_rejected(good, model, "consolidated.safetensors", "in both")


VALID_CONFIGS: list[tuple[str, Breakage]] = [
    ("head_dim derived", lambda d: _drop_config_key(d, "head_dim")),  # 64 // 4 = 16, the tiny model's
    ("integer rope_theta", _bad_rope("rope_theta", 1_000_000)[1]),
    ("transformers-4 rope keys", _transformers4(1e6)),
    ("null optional keys", _edit_config(head_dim=None, eos_token_id=None, rope_scaling=None, num_experts=None,
                                        mlp_only_layers=None)),
]


@pytest.mark.parametrize("name,edit", VALID_CONFIGS, ids=[c[0] for c in VALID_CONFIGS])
def test_valid_config_spellings_load(good: Engine, qwen3: Path, tmp_path: Path, name: str, edit: Breakage) -> None:
    model = _copy(qwen3, tmp_path)
    edit(model)
    assert_loads_like(good, model)


# ---- EOS ids: the ones HF's generate stops on ------------------------------------------------------------------
def _write_gen(**fields: Any) -> Breakage:
    return _gen_text(json.dumps({"bos_token_id": 0, **fields}))


EOS_SOURCES: list[tuple[str, Breakage, tuple[int, ...]]] = [
    ("files agree", lambda d: None, (1,)),
    ("generation config lists more", _write_gen(eos_token_id=[1, 7, 300]), (1, 7, 300)),
    ("generation config names another id", _write_gen(eos_token_id=7), (7,)),
    ("generation config without the key: no EOS", _write_gen(), ()),
    ("generation config null: no EOS", _write_gen(eos_token_id=None), ()),
    ("generation config empty list: no EOS", _write_gen(eos_token_id=[]), ()),
    ("no generation config: config.json's", lambda d: (d / GEN).unlink(), (1,)),
    ("no generation config, a list in config.json",
     lambda d: ((d / GEN).unlink(), _edit_config(eos_token_id=[1, 9])(d)), (1, 9)),
    ("no generation config, none in config.json",
     lambda d: ((d / GEN).unlink(), _drop_config_key(d, "eos_token_id")), ()),
]


@pytest.mark.parametrize("name,edit,want", EOS_SOURCES, ids=[c[0] for c in EOS_SOURCES])
def test_eos_ids_are_the_ones_hf_generate_stops_on(
    qwen3: Path, tmp_path: Path, name: str, edit: Breakage, want: tuple[int, ...]
) -> None:
    """generation_config.json's eos_token_id wins whenever the file exists (even unset: HF then never stops on
    EOS), config.json's only without it; transformers' own loader is the judge."""
    from transformers import AutoModelForCausalLM

    model = _copy(qwen3, tmp_path)
    edit(model)
    hf_eos = AutoModelForCausalLM.from_pretrained(model).generation_config.eos_token_id
    hf_ids = () if hf_eos is None else tuple(hf_eos) if isinstance(hf_eos, list) else (hf_eos,)
    assert hf_ids == want, f"transformers loads {hf_eos!r}: the case's expectation is stale"
    assert ModelConfig.from_dir(model).eos_token_ids == want


def test_the_driver_stops_on_an_eos_id_only_generation_config_lists(qwen3: Path, tmp_path: Path) -> None:
    model = _copy(qwen3, tmp_path)
    eng = Engine(_config(model))
    try:
        [free] = StaticDriver(eng).generate([[5, 6, 7]], SamplingParams(max_tokens=4))
    finally:
        eng.shutdown()
    first = free.output_ids[0]
    assert first != 1 and free.finish_reason == "length", "the tiny qwen3 must not stop on its own here"
    _write_gen(eos_token_id=[1, first])(model)
    eng = Engine(_config(model))
    try:
        [stopped] = StaticDriver(eng).generate([[5, 6, 7]], SamplingParams(max_tokens=4))
    finally:
        eng.shutdown()
    assert (stopped.output_ids, stopped.finish_reason) == ([first], "eos")
