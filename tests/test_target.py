"""Targets, the registries and plugin loading: what a user types picks exactly the engine that gets checked, and
anything that cannot run here is refused with the reason."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engine import ATTENTION_BACKENDS, ConfigError, Engine, Registry, Requires, Where
from engine.attention import TorchAttnBackend
from engine.config import INVARIANT_BACKENDS
from oracle.ops.bench import Bench
from oracle.plugins import PLUGINS_ENV, PluginError, load_plugins, plugin_names
from oracle.target import PRESETS, TARGET_ENV, TargetError, from_env, parse

CPU32 = Where(torch.device("cpu"), torch.float32, 16)


def test_presets_name_the_paths_they_check() -> None:
    assert parse("cpu-fp32") == PRESETS["cpu-fp32"]
    gpu = parse("cuda-bf16")
    assert (gpu.device, gpu.dtype, gpu.attention, gpu.kernels, gpu.sampler, gpu.graphs) == (
        "cuda",
        "bfloat16",
        "flashinfer",
        "triton",
        "flashinfer",
        True,
    )
    assert gpu.page_sizes == (1, 4, 16) and gpu.head_dim == 64
    reference = parse("cuda-bf16-torch")
    assert (reference.attention, reference.kernels, reference.sampler) == ("torch", "torch", "torch")


def test_overrides_and_toml_files(tmp_path: Path) -> None:
    t = parse("cuda-bf16, page_sizes=1/16, graphs=off, dtype=bf16")
    assert t.page_sizes == (1, 16) and t.graphs is False and t.dtype == "bfloat16" and t.attention == "flashinfer"
    assert parse("dtype=bfloat16").device == "cpu"  # no preset: overrides of the default
    invariant = parse("cpu-fp32,invariant=on")
    assert invariant.invariant is True and invariant.describe()["invariant"] is True
    assert (invariant.describe()["attention"], invariant.describe()["kernels"]) == ("torch", "torch_invariant")
    assert parse("cpu-fp32").invariant is False
    # invariant=on names the device's invariant attention and kernels itself, unless the keys name others.
    for preset in PRESETS.values():
        on = parse(f"{preset.name},invariant=on")
        assert (on.attention, on.kernels) == INVARIANT_BACKENDS[preset.device]
        assert (on.graphs, on.sampler) == (preset.graphs, preset.sampler)
    assert parse("cuda-bf16,invariant=on").kernels == "triton_invariant"
    assert parse("cuda-bf16,invariant=on,attention=flashinfer").attention == "flashinfer"
    assert parse("cpu-fp32,invariant=on,kernels=auto").kernels == "torch_invariant"  # as EngineConfig's "auto"
    assert parse("cuda-bf16").attention == "flashinfer"
    path = tmp_path / "mine.toml"
    path.write_text('preset = "cpu-fp32"\nattention = "example"\npage_sizes = [2, 8]\ngraphs = false\n')
    t = parse(str(path))
    assert (t.name, t.attention, t.page_sizes) == ("mine", "example", (2, 8))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpu-fast", "unknown target preset 'gpu-fast'"),
        ("cpu-fp32,colour=red", "unknown target key(s) colour"),
        ("cpu-fp32,graphs=maybe", "graphs='maybe'"),
        ("cpu-fp32,invariant=2", "invariant='2'"),
        ("cpu-fp32,page_sizes=0/4", "page_sizes='0/4'"),
        ("cpu-fp32,page_sizes=a", "page_sizes='a'"),
        ("cpu-fp32,head_dim=3", "head_dim='3'"),
        ("cpu-fp32,device=tpu", "device='tpu'"),
        ("cpu-fp32,dtype=int8", "dtype='int8'"),
        ("cpu-fp32,attention", "use key=value"),
        ("/nonexistent/t.toml", "target file /nonexistent/t.toml"),
    ],
)
def test_bad_targets_say_which_key(text: str, message: str) -> None:
    with pytest.raises(TargetError) as info:
        parse(text)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"head_dim = 16.9\n", "head_dim=16.9"),  # not truncated to 16, as the short form refuses head_dim=16.9
        (b"head_dim = true\n", "head_dim=True"),
        (b"page_sizes = [1.5, true]\n", "page_sizes=[1.5, True]"),
        (b"page_sizes = []\n", "page_sizes=[]"),
        (b"page_sizes = 4\n", "page_sizes=4"),
        (b"graphs = 1\n", "graphs=1"),
        (b"attention = 3\n", "attention=3"),
        (b'dtype = "fp8"\n', "dtype='fp8'"),  # checked in oracle.target, which needs torch
        (b'target = "cpu-fp32"\n', "target='cpu-fp32'"),
        (b"[target]\npreset = {a = 1}\n", "preset={'a': 1}"),
        (b"preset = 3\n", "preset=3"),
        (b"name = [1]\n", "name=[1]"),
        (b"colour = 'red'\n", "unknown target key(s) colour"),
        (b'attention = "caf\xe9"\n', "not UTF-8"),
    ],
)
def test_bad_toml_targets_name_the_file_and_key(content: bytes, message: str, tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_bytes(content)
    with pytest.raises(TargetError) as info:
        parse(str(path))
    assert str(info.value).startswith(f"target file {path}: ") and message in str(info.value), str(info.value)


def test_toml_and_short_form_values_agree(tmp_path: Path) -> None:
    path = tmp_path / "t.toml"
    path.write_text('[target]\npreset = "cpu-bf16"\npage_sizes = "1/4"\nhead_dim = 32\ngraphs = "off"\n')
    assert parse(str(path)) == replace(parse("cpu-bf16,page_sizes=1/4,head_dim=32,graphs=off"), name="t")


def test_a_target_that_cannot_run_here_says_why() -> None:
    assert parse("cpu-fp32").require() == parse("cpu-fp32")
    with pytest.raises(TargetError, match="float64: the harness has no logit tolerance"):
        parse("cpu-fp32,dtype=float64").require()
    with pytest.raises(TargetError, match="attention=mine: attention_backend='mine' is unknown"):
        parse("cpu-fp32,attention=mine").require()
    with pytest.raises(TargetError, match="graphs=on: CUDA graphs need device=cuda"):
        parse("cpu-fp32,graphs=on").require()
    with pytest.raises(TargetError, match="invariant=on: batch invariance runs on cpu with attention=torch and "
                       "kernels=torch_invariant"):
        parse("cpu-fp32,invariant=on,kernels=torch").require()
    assert parse("cpu-fp32,invariant=on").require().kernels == "torch_invariant"
    if not torch.cuda.is_available():
        with pytest.raises(TargetError, match="device=cuda: no CUDA device is available here"):
            parse("cuda-bf16").require()


def test_the_op_harness_runs_and_files_the_invariant_kernels_of_an_invariant_target() -> None:
    bench = Bench(parse("cpu-fp32,invariant=on"))
    bench.run_kernel("linear", "linear", torch.randn(3, 8), torch.randn(4, 8))
    assert bench.kernels_name == "torch_invariant" and bench.ledger.counts["linear"] == {"kernels=torch_invariant": 1}


def test_the_environment_gives_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TARGET_ENV, "cpu-bf16")
    assert from_env().name == "cpu-bf16"
    assert from_env("cpu-fp32").name == "cpu-fp32"
    monkeypatch.delenv(TARGET_ENV)
    assert from_env().name == "cpu-fp32"


def test_engine_config_carries_every_choice(tiny_models: dict[str, Path]) -> None:
    config = parse("cpu-bf16,attention=torch").engine_config(tiny_models["qwen3"], page_size=4)
    assert (config.device, config.dtype, config.attention_backend, config.layer_kernels) == (
        "cpu",
        "bfloat16",
        "torch",
        "torch",
    )
    assert (config.sampler_backend, config.cuda_graph_bs, config.page_size) == ("torch", [], 4)
    assert parse("cuda-bf16").engine_config(tiny_models["qwen3"]).cuda_graph_bs is None  # graphs: the default set
    invariant = parse("cpu-fp32,invariant=on").engine_config(tiny_models["qwen3"])
    assert invariant.batch_invariant is True and invariant.layer_kernels == "torch_invariant"


def test_registry_rules() -> None:
    reg: Registry[str] = Registry("thing", preferred=("fast",))
    reg.register("torch", "reference")
    reg.register("fast", "quick", requires=Requires(devices=("cuda",)))
    assert reg.resolve("auto", CPU32) == "torch"  # the preferred one cannot serve here
    assert reg.resolve("auto", Where(torch.device("cuda"), torch.bfloat16, 64)) == "fast"
    with pytest.raises(ConfigError, match="thing='fast' cannot be used: it needs a CUDA device, got cpu"):
        reg.resolve("fast", CPU32)
    with pytest.raises(ConfigError, match="thing='slow' is unknown; known: auto, fast, torch"):
        reg.resolve("slow", CPU32)
    with pytest.raises(ConfigError, match="already registered"):
        reg.register("fast", "again")
    reg.register("fast", "again", replace=True)
    assert reg.factory("fast") == "again"
    with pytest.raises(ConfigError, match="cannot be registered"):
        reg.register("auto", "x")
    with pytest.raises(ConfigError, match="cannot be removed"):
        reg.unregister("torch")
    reg.unregister("fast")
    assert reg.names() == ["auto", "torch"]


def test_a_registered_backend_serves_the_engine(tiny_models: dict[str, Path]) -> None:
    built: list[str] = []

    def factory(kv, table, heads, device):  # type: ignore[no-untyped-def]
        built.append("mine")
        return TorchAttnBackend(kv, table, heads)

    ATTENTION_BACKENDS.register("test-mine", factory)
    try:
        engine = Engine(parse("cpu-fp32,attention=test-mine").require().engine_config(tiny_models["qwen3"]))
        engine.shutdown()
        assert built == ["mine"]
    finally:
        ATTENTION_BACKENDS.unregister("test-mine")
    assert "test-mine" not in ATTENTION_BACKENDS


def test_plugins_load_by_name_and_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PLUGINS_ENV, "examples.my_attention, json")
    assert plugin_names(["examples.my_attention"]) == ["examples.my_attention", "json"]
    assert load_plugins()[:2] == ["examples.my_attention", "json"]
    assert "example" in ATTENTION_BACKENDS and "examples.my_attention" in sys.modules
    with pytest.raises(PluginError, match="plugin 'no_such_plugin_module' could not be imported: ModuleNotFoundError"):
        load_plugins(["no_such_plugin_module"])


def test_sampler_backend_is_chosen_by_name(tiny_models: dict[str, Path]) -> None:
    from engine import EngineConfig

    with pytest.raises(ConfigError, match="sampler_backend=3 is invalid"):
        EngineConfig(str(tiny_models["qwen3"]), sampler_backend=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="sampler_backend='flashinfer' cannot be used: it needs a CUDA device"):
        Engine(EngineConfig(str(tiny_models["qwen3"]), device="cpu", sampler_backend="flashinfer"))
    engine = Engine(EngineConfig(str(tiny_models["qwen3"]), device="cpu", sampler_backend="torch"))
    assert not engine.sampler.use_flashinfer
    engine.shutdown()


def test_moe_leaves_the_continuity_laws_below_float32() -> None:
    from oracle.drive import continuous_archs
    from oracle.zoo import TINY_ARCHS

    assert continuous_archs(parse("cpu-fp32")) == TINY_ARCHS
    assert continuous_archs(parse("cpu-bf16")) == tuple(a for a in TINY_ARCHS if a != "qwen3_moe")


def test_the_suite_runs_from_outside_the_checkout(tmp_path: Path) -> None:
    """The installed package's pytest11 entry point brings the options, profiles and fixtures (no conftest here)."""
    import subprocess
    from importlib.metadata import entry_points

    if not entry_points(group="pytest11", name="oracle.pytest_plugin"):
        pytest.skip("the project is not installed (only on PYTHONPATH): no pytest11 entry point to test")

    cmd = [sys.executable, "-m", "pytest", "--pyargs", "properties", "-p", "no:cacheprovider", "-k", "synthetic"]
    cmd += ["--target", "cpu-bf16", "--hypothesis-profile=dev", "--basetemp", str(tmp_path / "t")]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "target: cpu-bf16" in proc.stdout and "1 passed" in proc.stdout


def test_the_mutant_table_refuses_a_target_that_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    from oracle.mutants.__main__ import main

    assert main(["--list", "--target", "cpu-fp32,attention=nope"]) == 2
    assert "attention=nope: attention_backend='nope' is unknown" in capsys.readouterr().err


def test_the_mutant_table_hands_its_children_the_target_as_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from oracle.mutants.__main__ import main

    path = tmp_path / "mine.toml"
    path.write_text('preset = "cpu-bf16"\n')
    monkeypatch.setenv(TARGET_ENV, "cpu-fp32")  # restored after the test; main() sets it for its children
    assert main(["--list", "--target", str(path)]) == 0
    assert from_env().dtype == "bfloat16"
