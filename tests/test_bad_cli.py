"""Bad invocations of the command lines (``python -m oracle verify`` / ``hfparity-verify``, ``python -m oracle.zoo``,
``python -m oracle.mutants`` / ``hfparity-mutants``): each exits 2 with one ``error:`` line naming the option or the
value at fault, no traceback, and nothing written; checked in-process through each ``main(argv)``, and end to end
for a few. Also: a model whose weights hold NaN loads, so it is a run that errors (exit 3, report written), never
a model that could not start; and a seed at the top of its range runs. Issue #24: no output is or lies inside an input
(model dir, plugin, target TOML), even with --force; an existing file a tool did not write needs --force; and a
writer that fails midway leaves the old report whole."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from benchmarks import baseline
from engine import ATTENTION_BACKENDS
from engine.engine import Engine
from oracle.__main__ import main as oracle_main
from oracle.__main__ import verify_main
from oracle.mutants.__main__ import main as mutants_main
from oracle.mutants.runner import write_json as write_mutants_json
from oracle.plugins import PLUGINS_ENV
from oracle.target import PRESETS, TARGET_ENV
from oracle.verify import Environment, VerifyResult, report
from oracle.zoo.__main__ import main as zoo_main

REPO = Path(__file__).resolve().parents[1]

# A case's argv comes from a builder given the tiny model and a scratch dir, whose "o" is the default --out.
Build = Callable[[Path, Path], list[str]]


def _model(case: str, tiny: Path, tmp: Path) -> Path:
    """A broken copy of the tiny model dir for a model-dir case."""
    path = tmp / f"model-{case}"
    if case == "no-config":
        path.mkdir()
        shutil.copy(tiny / "model.safetensors", path)
    elif case in ("bad-json", "gpt2"):
        shutil.copytree(tiny, path)
        config = json.loads((path / "config.json").read_text()) | {"architectures": ["GPT2LMHeadModel"]}
        (path / "config.json").write_text("{not json" if case == "bad-json" else json.dumps(config))
    return path


def _blocker(tmp: Path) -> Path:
    """A regular file: any path under it cannot be written, even by root."""
    path = tmp / "a-file"
    path.write_text("not a directory")
    return path


def _raising_plugin(tmp: Path) -> str:
    (tmp / "plugin_that_raises.py").write_text("raise RuntimeError('broken on purpose')\n")
    return "plugin_that_raises"


def _exiting_plugin(tmp: Path) -> str:
    (tmp / "plugin_that_exits.py").write_text("import sys\nsys.exit(0)\n")
    return "plugin_that_exits"


def _plugin(tmp: Path, name: str, source: str) -> str:
    (tmp / f"{name}.py").write_text(source)
    return name


_TAKES_TORCH = "from engine import SAMPLERS\nSAMPLERS.register('torch', object)\n"  # a name the engine holds


def _toml(tmp: Path, text: str) -> str:
    path = tmp / "target.toml"
    path.write_text(text)
    return str(path)


def _args(*extra: str) -> Build:
    return _with(lambda t: list(extra))


def _with(make: Callable[[Path], list[str]]) -> Build:
    """verify on the tiny model, --quick, --out under the scratch dir, then make(scratch dir)'s arguments."""
    return lambda m, t: ["verify", "--model", str(m), "--quick", "--out", str(t / "o"), *make(t)]


VERIFY_CASES = [
    pytest.param(lambda m, t: [], ("command",), id="no subcommand"),
    pytest.param(lambda m, t: ["check", "--model", str(m)], ("'check'",), id="unknown subcommand"),
    pytest.param(lambda m, t: ["verify", "--quick"], ("--model",), id="missing --model"),
    pytest.param(_args("--fast"), ("--fast",), id="unknown option"),
    pytest.param(_args("--target", "tpu-fp8"), ("'tpu-fp8'",), id="unknown --target preset"),
    pytest.param(_args("--target", "cpu-fp32,speed=max"), ("speed",), id="unknown --target key"),
    pytest.param(_args("--target", "cpu-fp32,dtype=fp8"), ("dtype='fp8'",), id="--target bad dtype"),
    pytest.param(_args("--target", "nowhere.toml"), ("nowhere.toml",), id="--target file missing"),
    pytest.param(_with(lambda t: ["--target", _toml(t, "preset = [")]), ("target.toml",), id="--target bad TOML"),
    pytest.param(
        _with(lambda t: ["--target", _toml(t, "head_dim = 16.9")]),
        ("target.toml", "head_dim=16.9"),
        id="--target TOML float head_dim",
    ),
    pytest.param(
        _args("--plugin", "no_such_plugin_module"),
        ("'no_such_plugin_module'", "ModuleNotFoundError", "on sys.path", "PYTHONPATH", f"directory: {os.getcwd()}"),
        id="unknown --plugin",
    ),
    pytest.param(
        _args("--plugin", "no_such_package.mine"),
        ("'no_such_package.mine'", "No module named 'no_such_package'", "PYTHONPATH"),
        id="--plugin in a missing package",
    ),
    pytest.param(
        lambda m, t: ["verify", "--model", str(t / "nowhere"), "--out", str(t / "o")],
        ("--model", "nowhere", "is not a directory", "oracle.zoo smollm2"),
        id="--model missing",
    ),
    pytest.param(
        lambda m, t: ["verify", "--model", str(_blocker(t)), "--out", str(t / "o")],
        ("--model", "a-file", "is not a directory"),
        id="--model a file",
    ),
    pytest.param(
        _with(lambda t: ["--plugin", _raising_plugin(t)]),
        ("'plugin_that_raises'", "RuntimeError", "broken on purpose"),
        id="--plugin raises on import",
    ),
    pytest.param(
        _with(lambda t: ["--plugin", _exiting_plugin(t)]),
        ("'plugin_that_exits'", "SystemExit"),
        id="--plugin exits on import",
    ),
    pytest.param(
        _with(lambda t: ["--plugin", _plugin(t, "plugin_takes_torch", _TAKES_TORCH)]),
        ("'plugin_takes_torch'", "ConfigError", "sampler_backend='torch' is already registered"),
        id="--plugin registration raises",
    ),
    pytest.param(_args("--seed", "0x1f"), ("--seed", "'0x1f'"), id="--seed not an int"),
    pytest.param(_args("--seed", "-1"), ("--seed", "'-1'"), id="--seed negative"),
    pytest.param(_args("--seed", str(2**63)), ("--seed", str(2**63)), id="--seed past 2**63"),
    pytest.param(_with(lambda t: ["--out", str(_blocker(t) / "o")]), ("--out", "a-file"), id="--out under a file"),
    pytest.param(_with(lambda t: ["--json", str(_blocker(t) / "r")]), ("--json", "a-file"), id="--json under a file"),
    pytest.param(_with(lambda t: ["--report", str(_blocker(t) / "r")]), ("--report",), id="--report under a file"),
    pytest.param(_with(lambda t: ["--junit", str(_blocker(t) / "j")]), ("--junit",), id="--junit under a file"),
    pytest.param(_with(lambda t: ["--json", str(t)]), ("--json", "is a directory"), id="--json a directory"),
    pytest.param(
        _with(lambda t: ["--json", str(t / "r"), "--report", str(t / "r")]),
        ("--json and --report both write",),
        id="--json and --report one file",
    ),
    pytest.param(
        _with(lambda t: ["--junit", str(t / "o" / "verify-tiny-qwen3.json")]),
        ("--out", "--junit", "both write"),
        id="--junit onto the default JSON",
    ),
    pytest.param(
        _with(lambda t: ["--report", str(t / "r.png")]),
        ("--report and the plot of --report both write", "r.png"),
        id="--report ending in .png",
    ),
    pytest.param(
        _with(lambda t: ["--json", str(t / "r"), "--junit", str(t / "r" / "j.xml")]),
        ("--junit", "inside", "--json writes as a file"),
        id="--junit inside the --json file",
    ),
]


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if an engine is built: these errors must be found before any run."""

    def refuse(*args: Any, **kwargs: Any) -> Engine:
        raise AssertionError("an engine was built although the run should have stopped before")

    monkeypatch.setattr("oracle.verify.sections.Engine", refuse)


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def _call(main: Callable[[list[str]], int], argv: list[str]) -> int:
    """main(argv)'s exit status, whether it returns it or argparse raises SystemExit with it."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1


def assert_usage_error(code: int, err: str, *names: str) -> None:
    """Exit 2, no traceback, and exactly one error line, which names every one of `names`."""
    assert code == 2, err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error: ") or ": error: " in line]
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], (name, lines[0])


@pytest.mark.parametrize(("build", "names"), VERIFY_CASES)
def test_a_bad_verify_invocation_is_one_error_line_and_exit_2_before_any_engine(
    build: Build,
    names: tuple[str, ...],
    qwen3: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_engine: None,
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))  # where the raising plugin is written
    argv = build(qwen3, tmp_path)
    before = _files(tmp_path)
    assert_usage_error(_call(oracle_main, argv), capsys.readouterr().err, *names)
    assert _files(tmp_path) == before  # nothing written, no dir made


MODEL_CASES = [
    pytest.param("no-config", ("model-no-config", "config.json"), id="--model without config.json"),
    pytest.param("bad-json", ("config.json", "is not valid JSON"), id="--model config.json not JSON"),
    pytest.param("gpt2", ("GPT2LMHeadModel",), id="--model unsupported architecture"),
]


@pytest.mark.parametrize(("case", "names"), MODEL_CASES)
def test_a_bad_model_dir_is_one_error_line_and_exit_2(
    case: str, names: tuple[str, ...], qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _model(case, qwen3, tmp_path)  # the engine reads the dir: it is built here, and refuses it
    before = _files(tmp_path)
    code = oracle_main(["verify", "--model", str(model), "--quick", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert_usage_error(code, err, "ModelLoadError", *names)
    assert err.strip().splitlines()[-1].startswith("hint: ")
    assert _files(tmp_path) == before


def test_the_console_script_reports_bad_usage_the_same_way(
    qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_engine: None
) -> None:
    blocked = _blocker(tmp_path) / "o"
    assert_usage_error(verify_main(["--quick"]), capsys.readouterr().err, "--model")
    code = verify_main(["--model", str(qwen3), "--out", str(blocked)])
    assert_usage_error(code, capsys.readouterr().err, f"--out {blocked}", f"cannot write {blocked}")
    assert _files(tmp_path) == {blocked.parent}


def _foreign_model_dir(tmp: Path) -> Path:
    """A DIR whose tiny-qwen3 holds the user's own file, not a model the zoo wrote."""
    (tmp / "o" / "tiny-qwen3").mkdir(parents=True)
    (tmp / "o" / "tiny-qwen3" / "mine.txt").write_text("mine")
    return tmp / "o"


# These builders get only the scratch dir.
ZOO_CASES = [
    pytest.param(lambda t: [], ("command",), id="no command"),
    pytest.param(lambda t: ["smollm3"], ("'smollm3'",), id="unknown command"),
    pytest.param(lambda t: ["tiny", "gpt2", str(t / "o")], ("arch", "'gpt2'"), id="tiny unknown arch"),
    pytest.param(lambda t: ["tiny", "qwen3"], ("dir",), id="tiny without DIR"),
    pytest.param(lambda t: ["tiny", "qwen3", str(_blocker(t) / "o")], ("DIR", "a-file"), id="tiny DIR under a file"),
    pytest.param(lambda t: ["tiny", "qwen3", str(_blocker(t))], ("DIR", "is not a directory"), id="tiny DIR a file"),
    pytest.param(
        lambda t: ["smollm2", "--quiet", "--cache-dir", str(_blocker(t) / "c")],
        ("--cache-dir", "a-file"),
        id="smollm2 --cache-dir under a file",
    ),
    pytest.param(lambda t: ["smollm2", "--fast"], ("--fast",), id="smollm2 unknown option"),
    pytest.param(lambda t: ["tiny", "qwen3", str(_foreign_model_dir(t))], ("DIR", "tiny-qwen3", "did not write"),
                 id="tiny DIR/tiny-ARCH not the zoo's"),
]


@pytest.mark.parametrize(("build", "names"), ZOO_CASES)
def test_a_bad_zoo_invocation_is_one_error_line_and_exit_2(
    build: Callable[[Path], list[str]], names: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = build(tmp_path)
    before = _files(tmp_path)
    assert_usage_error(_call(zoo_main, argv), capsys.readouterr().err, *names)
    assert _files(tmp_path) == before


def _mutants_json_dir(tmp: Path) -> list[str]:
    (tmp / "o" / "mutants.json").mkdir(parents=True)
    return []


# After --out SCRATCH/o.
MUTANTS_CASES = [
    pytest.param(lambda t: ["--only", "no_such_mutant"], ("--only", "'no_such_mutant'"), id="unknown --only"),
    pytest.param(lambda t: ["-j", "0"], ("-j/--jobs", "'0'"), id="--jobs 0"),
    pytest.param(lambda t: ["--jobs", "two"], ("-j/--jobs", "'two'"), id="--jobs not an int"),
    pytest.param(lambda t: ["--timeout", "-5"], ("--timeout", "'-5'"), id="--timeout negative"),
    pytest.param(lambda t: ["--timeout", "nan"], ("--timeout", "'nan'"), id="--timeout nan"),
    pytest.param(lambda t: ["--target", "tpu-fp8"], ("'tpu-fp8'",), id="unknown --target"),
    pytest.param(lambda t: ["--plugin", "no_such_plugin_module"], ("'no_such_plugin_module'",), id="unknown --plugin"),
    pytest.param(lambda t: ["--out", str(_blocker(t) / "o")], ("--out", "a-file"), id="--out under a file"),
    pytest.param(_mutants_json_dir, ("--out", "mutants.json", "is a directory"), id="--out's mutants.json a dir"),
    pytest.param(lambda t: ["--all"], ("--all",), id="unknown option"),
]


@pytest.mark.parametrize(("build", "names"), MUTANTS_CASES)
def test_a_bad_mutants_invocation_is_one_error_line_and_exit_2_before_any_run(
    build: Callable[[Path], list[str]],
    names: tuple[str, ...],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_run(*args: Any, **kwargs: Any) -> list[Any]:
        raise AssertionError("the mutant table ran although the invocation was bad")

    monkeypatch.setattr("oracle.mutants.__main__.run_table", no_run)
    for name in (TARGET_ENV, PLUGINS_ENV):  # restored afterwards, should main() get as far as setting them
        monkeypatch.delenv(name, raising=False)
    argv = ["--out", str(tmp_path / "o"), *build(tmp_path)]
    before = _files(tmp_path)
    assert_usage_error(_call(mutants_main, argv), capsys.readouterr().err, *names)
    assert _files(tmp_path) == before


def test_a_plugin_factory_that_raises_as_the_engine_builds_it_is_exit_2(
    qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    source = "from engine import ATTENTION_BACKENDS\n\ndef broken(*args):\n    raise RuntimeError('no kernel')\n\n"
    name = _plugin(tmp_path, "plugin_broken_factory", source + "ATTENTION_BACKENDS.register('test-broken', broken)\n")
    argv = ["verify", "--model", str(qwen3), "--quick", "--out", str(tmp_path / "o"), "--plugin", name]
    try:
        code = oracle_main([*argv, "--target", "cpu-fp32,attention=test-broken"])
    finally:
        ATTENTION_BACKENDS.unregister("test-broken")
        sys.modules.pop(name, None)
    err = capsys.readouterr().err
    assert_usage_error(code, err, "PluginError", f"plugin {name!r}", "attention_backend='test-broken'", "no kernel")
    assert not (tmp_path / "o").exists()


def _cli(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    cmd = [sys.executable, "-m", module, *argv]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_end_to_end_an_unwritable_out_is_exit_2_and_creates_nothing(qwen3: Path, tmp_path: Path) -> None:
    blocked = _blocker(tmp_path) / "reports"
    before = _files(tmp_path)
    proc = _cli("oracle", "verify", "--model", str(qwen3), "--out", str(blocked), cwd=tmp_path)
    assert_usage_error(proc.returncode, proc.stderr, "--out", str(blocked))
    assert proc.stdout == "" and _files(tmp_path) == before


def test_end_to_end_bad_mutants_and_zoo_arguments_are_exit_2(tmp_path: Path) -> None:
    # --list: were the bad value accepted, nothing would run (and the test fail at once).
    proc = _cli("oracle.mutants", "--list", "--jobs", "-1", "--out", str(tmp_path / "o"), cwd=tmp_path)
    assert_usage_error(proc.returncode, proc.stderr, "-j/--jobs", "'-1'")
    proc = _cli("oracle.zoo", "tiny", "qwen3", str(_blocker(tmp_path) / "m"), cwd=tmp_path)
    assert_usage_error(proc.returncode, proc.stderr, "DIR", "a-file")
    assert _files(tmp_path) == {tmp_path / "a-file"}


@pytest.mark.parametrize(
    ("command", "source", "names"),
    [
        (("oracle", "verify"), "raise KeyboardInterrupt\n", ("'plugin_ends'", "KeyboardInterrupt")),
        (("oracle", "verify"), "import os\nos._exit(0)\n", ("plugin_ends", "ended the process with exit status 0")),
        (("oracle.mutants", "--list"), "import os\nos._exit(0)\n", ("plugin_ends", "exit status 0")),
    ],
    ids=["verify, KeyboardInterrupt", "verify, os._exit(0)", "mutants, os._exit(0)"],
)
def test_end_to_end_a_plugin_that_ends_the_process_on_import_is_exit_2(
    command: tuple[str, ...], source: str, names: tuple[str, ...], qwen3: Path, tmp_path: Path
) -> None:
    # In a child: without the fix an os._exit(0) would end this test session as a pass.
    model = ["--model", str(qwen3), "--quick"] if "verify" in command else []
    name = _plugin(tmp_path, "plugin_ends", source)
    proc = _cli(*command, *model, "--out", str(tmp_path / "o"), "--plugin", name, cwd=tmp_path)
    assert_usage_error(proc.returncode, proc.stderr, *names)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("raise KeyboardInterrupt\n", "plugin 'plugin_ends' could not be imported: KeyboardInterrupt"),
        ("import os\nos._exit(0)\n", "ended the process with exit status 0"),
    ],
    ids=["KeyboardInterrupt", "os._exit(0)"],
)
def test_the_pytest_plugin_reports_a_plugin_that_ends_the_process_as_a_usage_error(
    tmp_path: Path, source: str, message: str
) -> None:
    # Without the probe, os._exit(0) in the plugin would end the session with status 0: a pass with no tests run.
    _plugin(tmp_path, "plugin_ends", source)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}
    cmd = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "--plugin", "plugin_ends"]
    proc = subprocess.run(
        [*cmd, "tests/test_bad_cli.py"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr


def _nan_model(tiny: Path, tmp: Path) -> Path:
    """The tiny model with one weight tensor filled with NaN: it loads, and every forward pass computes NaN."""
    path = tmp / "nan-qwen3"
    shutil.copytree(tiny, path)
    weights = safetensors.torch.load_file(path / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    weights[name] = torch.full_like(weights[name], float("nan"))
    safetensors.torch.save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def test_a_model_with_nan_weights_is_a_run_that_errors_not_a_model_that_could_not_start(
    qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _nan_model(qwen3, tmp_path)
    out, junit = tmp_path / "o", tmp_path / "j.xml"
    assert oracle_main(["verify", "--model", str(model), "--quick", "--out", str(out), "--junit", str(junit)]) == 3
    captured = capsys.readouterr()
    assert not [line for line in captured.err.splitlines() if line.startswith(("error:", "hint:"))], captured.err
    assert "verdict: ERROR" in captured.out
    data = json.loads((out / "verify-nan-qwen3.json").read_text())
    assert data["status"] == "error" and not data["passed"]
    error, *_ = [c for c in data["checks"] if c["status"] == "error"]
    assert error["section"] == "run" and error["name"] == "greedy generation: NonFiniteLogitsError"
    assert "NaN logits" in error["detail"] and "check its weights" in error["detail"], error
    # every section ran or says why not; none that needs the generations passed without them
    assert not [c for c in data["checks"] if c["status"] == "pass" and c["section"] in ("greedy parity", "sampling")]
    assert "**ERROR**" in (out / "verify-nan-qwen3.md").read_text() and "<error" in junit.read_text()


def test_the_largest_seed_runs(qwen3: Path, tmp_path: Path) -> None:
    # The seeded-sampling section derives request seeds from it, which must stay in the engine's [0, 2**63).
    argv = ["verify", "--model", str(qwen3), "--quick", "--seed", str(2**63 - 1), "--out", str(tmp_path)]
    assert oracle_main(argv) == 0



# Issue #24: an output never replaces an input, nor a file the tool did not write unless --force.


def _digests(root: Path) -> dict[Path, str]:
    return {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def _inputs(tiny: Path, tmp: Path) -> Path:
    """A copy of the tiny model, a plugin module and a target TOML under `tmp`, all hashed by the tests; the model."""
    model = tmp / "m"
    shutil.copytree(tiny, model)
    (tmp / "myplugin.py").write_text("MINE = True\n")
    (tmp / "target.toml").write_text('preset = "cpu-fp32"\n')
    (tmp / "notes.md").write_text("# my notes, not a verify report\n")
    return model


# After verify --model SCRATCH/m --quick; each builder gets the scratch dir.
INPUT_CASES = [
    pytest.param(lambda t: ["--report", str(t / "m" / "model.safetensors"), "--force"],
                 ("--report", "model.safetensors"), id="--report on the weights with --force"),
    pytest.param(lambda t: ["--json", str(t / "m" / "config.json")], ("--json", "config.json"), id="--json on config"),
    pytest.param(lambda t: ["--json", str(t / "m" / "config.json"), "--force"], ("--json", "config.json"),
                 id="--json on config with --force"),
    pytest.param(lambda t: ["--out", str(t / "m")], ("--out", "--model"), id="--out the model dir"),
    pytest.param(lambda t: ["--junit", str(t / "m" / "sub" / "j.xml")], ("--junit", "j.xml"), id="--junit under it"),
    pytest.param(lambda t: ["--plugin", "myplugin", "--junit", str(t / "myplugin.py"), "--force"],
                 ("--junit", "myplugin.py", "--plugin myplugin"), id="--junit on the plugin file"),
    pytest.param(lambda t: ["--target", str(t / "target.toml"), "--json", str(t / "target.toml"), "--force"],
                 ("--json", "target.toml", "--target"), id="--json on the target TOML"),
    pytest.param(lambda t: ["--report", str(t / "notes.md")], ("--report", "notes.md", "--force"),
                 id="--report on a foreign file"),
]


@pytest.mark.parametrize(("build", "names"), INPUT_CASES)
def test_an_output_on_an_input_or_a_foreign_file_is_exit_2_and_every_file_unchanged(
    build: Callable[[Path], list[str]],
    names: tuple[str, ...],
    qwen3: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    no_engine: None,
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))  # where the plugin is
    model = _inputs(qwen3, tmp_path)
    before = _digests(tmp_path)
    argv = ["verify", "--model", str(model), "--quick", "--out", str(tmp_path / "o"), *build(tmp_path)]
    assert_usage_error(_call(oracle_main, argv), capsys.readouterr().err, *names)
    assert _digests(tmp_path) == before and _files(tmp_path) == set(before) | {model}


def test_verify_replaces_its_own_report_and_a_foreign_file_only_with_force(
    qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr("oracle.verify.command.execute", lambda args, outputs: ran.append(argv) or 0)
    ours = tmp_path / "ours.md"
    ours.write_text("# Verification report: `m`\n")
    argv = ["verify", "--model", str(qwen3), "--report", str(ours), "--json", str(tmp_path / "r.json")]
    assert oracle_main(argv) == 0 and ran == [argv]  # a report it wrote: replaced without --force
    (tmp_path / "r.json").write_text('{"mine": 1}')
    assert_usage_error(oracle_main(argv), capsys.readouterr().err, "--json", "r.json", "--force")
    argv = [*argv, "--force"]
    assert oracle_main(argv) == 0 and ran[-1] == argv


def test_mutants_refuse_a_foreign_report_or_an_input_as_out_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Ran(Exception):
        pass

    def ran(*args: Any, **kwargs: Any) -> list[Any]:
        raise Ran

    monkeypatch.setattr("oracle.mutants.__main__.run_table", ran)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in (TARGET_ENV, PLUGINS_ENV):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "myplug").mkdir()
    (tmp_path / "myplug" / "__init__.py").write_text("MINE = True\n")
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "mutants.json").write_text('{"mine": 1}')
    before = _digests(tmp_path)
    code = mutants_main(["--plugin", "myplug", "--out", str(tmp_path / "myplug"), "--force"])
    assert_usage_error(code, capsys.readouterr().err, "--out", "--plugin myplug")
    code = mutants_main(["--out", str(tmp_path / "o")])
    assert_usage_error(code, capsys.readouterr().err, "--out", "mutants.json", "--force")
    assert _digests(tmp_path) == before and _files(tmp_path) == set(before) | {tmp_path / "myplug", tmp_path / "o"}
    with pytest.raises(Ran):
        mutants_main(["--out", str(tmp_path / "o"), "--force"])


def test_baseline_save_refuses_a_file_that_is_not_a_baseline_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[list[str]] = []
    monkeypatch.setattr(baseline, "run_pytest", lambda args: runs.append(args) or 1)
    (tmp_path / "syn.json").write_text("mine")
    before = _digests(tmp_path)
    argv = ["save", "syn", "--dir", str(tmp_path)]
    assert_usage_error(baseline.main(argv), capsys.readouterr().err, "save syn", "syn.json", "--force")
    assert runs == [] and _digests(tmp_path) == before
    assert baseline.main([*argv, "--force"]) == 1 and len(runs) == 1  # the run failed: the file is left as it was
    assert _digests(tmp_path) == before


def _half_then_fail(text: str, fh: Any) -> None:
    fh.write(text[: len(text) // 2])
    fh.flush()
    raise OSError("no space left on device")


def test_a_writer_that_fails_midway_leaves_the_old_report_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = VerifyResult("m", "quick", PRESETS["cpu-fp32"], "float32", 0, 1e-3, Environment("c", {}, "cpu"))
    old = {name: tmp_path / name for name in ("v.json", "v.md", "mutants.json")}
    for path in old.values():
        path.write_text(f"the previous {path.name}")
    before = _digests(tmp_path)
    monkeypatch.setattr(json, "dump", lambda obj, fh, **kw: _half_then_fail(json.dumps(obj, **kw), fh))

    def write_text(self: Path, text: str, *args: Any, **kwargs: Any) -> int:
        with self.open("w") as fh:
            _half_then_fail(text, fh)
        return 0

    monkeypatch.setattr(Path, "write_text", write_text)
    with pytest.raises(OSError, match="no space"):
        report.write_json(result, old["v.json"])
    with pytest.raises(OSError, match="no space"):
        report.write_markdown(result, old["v.md"], None)
    with pytest.raises(OSError, match="no space"):
        write_mutants_json([], old["mutants.json"], True, "cpu-fp32")
    assert _digests(tmp_path) == before and _files(tmp_path) == set(before)  # whole, and no temporary file left
