"""The harness's pytest plugin (entry point ``pytest11``): options, Hypothesis profiles and the session fixtures, one
source for tests/, properties/ and any suite run with ``pytest --pyargs properties``.

Options: ``--target NAME`` (a preset with ``,key=value`` overrides, or a TOML file; default ``$HFPARITY_TARGET`` or
``cpu-fp32``, see :mod:`oracle.target`) and ``--plugin MODULE`` (repeatable; see :mod:`oracle.plugins`). A target
that cannot run here stops the session with a usage error saying why. The GPU tests take ``gpu_target``: the
named target, or ``cuda-bf16`` where none is named.

Hypothesis profiles (``--hypothesis-profile NAME`` or ``$HYPOTHESIS_PROFILE``; default ``ci``):

* ``ci``: derandomized (the same examples on every run), no example database, no deadline (a forward pass on a
  loaded 2-core machine takes what it takes), print_blob so a failure replays with ``@reproduce_failure``; 25
  examples per test before the per-test shares of :func:`oracle.budget.examples`.
* ``deep``: 400 examples per test, random (a new seed each run), the local example database kept.
* ``dev``: 5 examples per test, derandomized: a quick smoke run while editing (floors not judged, as under
  ``fast``).
* ``fast``: the kernel engineer's loop (README, "Checking your own kernel"): 3 examples per test, derandomized,
  the first bug reported without looking for others, shrinking cut after ``SHRINK_SECONDS["fast"]``, and no vacuity
  floors judged: a profile under ``oracle.coverage.MIN_EXAMPLES`` examples per test says nothing about coverage.
* ``ci-random``: ``ci``'s example counts (so the same α per check) with a random seed, or ``--hypothesis-seed``'s:
  runs the statistical properties under many seeds to count false failures.
* ``gpu``: ``ci`` with 10 examples per test and no shrinking, for ``--target cuda-*`` inside one 10-minute device
  call.

Shrinking stops after ``SHRINK_SECONDS`` of the active profile (Hypothesis' own cap is five minutes), so a failure
reports in seconds with the smallest example found so far. Collected tests run cheapest first (:func:`cost_tier`):
the op-level properties, then the tiny-model ones, the statistical ones and last the real model's, so ``-x`` stops
at the cheapest property that sees a bug.

HealthCheck.too_slow is suppressed everywhere: one example runs whole forward passes, which Hypothesis counts as
slow data generation for strategies drawn inside the test, and the CI machine is shared.

Examples are pinned: Hypothesis also draws constants it finds in the loaded local modules (engine/, oracle/,
a plugin), so which modules a run imported, and any edit to them, would move the derandomized examples; the plugin
restricts it to its own fixed constants (:func:`pin_hypothesis_constants`). Each test call also runs inside a
vacuity tally (:mod:`oracle.coverage`): a passing test whose examples too rarely exercised the cases its ``@floors``
declare fails; the shares are a report section (``-rP``).

Threads: unless OMP_NUM_THREADS is set, the session runs torch single-threaded (and the engine, which leaves the
thread count alone when OMP_NUM_THREADS is set, follows): on a loaded 2-core machine every OpenMP barrier can wait a
whole time slice (a SmolLM2 generation took 16 s with 2 threads and 1.8 s with 1).
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from _pytest.junitxml import xml_key
from hypothesis import HealthCheck, Phase, settings

from oracle import coverage
from oracle.plugin_probe import probe_plugins
from oracle.plugins import PluginError, check_findable, load_plugins, plugin_names
from oracle.target_spec import DEVICE_DEFAULTS, TARGET_ENV, TargetError, named_text, parse_spec, target_text

if TYPE_CHECKING:  # torch and the engine load in pytest_configure, once the usage checks passed
    import torch

    from oracle.drive import EnginePool
    from oracle.hf import HFOracle
    from oracle.ops.bench import Bench
    from oracle.ops.ledger import Ledger
    from oracle.target import Target

PROFILE_ENV = "HYPOTHESIS_PROFILE"

_NO_SHRINK = [p for p in Phase if p is not Phase.shrink]
_COMMON = settings(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", _COMMON, max_examples=25, derandomize=True, database=None)
settings.register_profile("deep", _COMMON, max_examples=400, derandomize=False)
settings.register_profile("dev", _COMMON, max_examples=5, derandomize=True, database=None)
settings.register_profile(
    "fast", _COMMON, max_examples=3, derandomize=True, database=None, report_multiple_bugs=False
)
settings.register_profile("ci-random", _COMMON, max_examples=25, derandomize=False, database=None)
# No shrinking on the GPU: a failing example is reported as found, since device time is scarce.
settings.register_profile("gpu", _COMMON, max_examples=10, derandomize=True, database=None, phases=_NO_SHRINK)

# Seconds a failure may spend shrinking, per profile; one example more may run past it.
SHRINK_SECONDS = {"fast": 10, "dev": 20, "deep": 120}
DEFAULT_SHRINK_SECONDS = 30

_TARGET_KEY: pytest.StashKey[Target] = pytest.StashKey()
_LEDGER_KEY: pytest.StashKey[Ledger] = pytest.StashKey()
_PLUGINS_KEY: pytest.StashKey[list[str]] = pytest.StashKey()
_PROVENANCE_KEY: pytest.StashKey[dict[str, str]] = pytest.StashKey()

MARKERS = (
    "model: needs the real SmolLM2 model (built once from PyPI into the cache)",
    "gpu: needs a CUDA GPU; skipped without one",
    "slow: long-running; deselect with -m 'not slow'",
    "statistical: can fail a correct engine by chance (α-budgeted); python -m oracle.false_failures runs these",
    "kernel: an op-level property (one kernel call against its reference); `-m kernel` is the fast inner loop",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hfparity", "engine-vs-HF harness")
    group.addoption("--target", default=None, help=f"what to check (preset[,key=value...] or FILE.toml); ${TARGET_ENV}")
    group.addoption("--plugin", action="append", default=[], metavar="MODULE", help="import MODULE first (repeatable)")
    group.addoption("--replay", default=None, metavar="VERSION:BLOB",
                    help="run the selected Hypothesis tests on one failing example (the replay line of a failure)")


def pin_hypothesis_constants() -> None:
    """Make Hypothesis ignore the constants of local modules (see the module doc); its global ones stay."""
    from hypothesis.internal.conjecture import providers

    empty = providers.Constants()
    providers._get_local_constants = lambda: empty  # the lookup HypothesisProvider makes for every example
    providers.CONSTANTS_CACHE.cache.clear()


def pytest_configure(config: pytest.Config) -> None:
    try:  # a misspelled target or a missing plugin stops the session before torch is imported
        parse_spec(target_text(config.getoption("target")))
        check_findable(config.getoption("plugin"))
    except (TargetError, PluginError) as exc:
        raise pytest.UsageError(str(exc)) from None
    import torch

    from oracle.target import from_env

    pin_hypothesis_constants()
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if not os.environ.get("OMP_NUM_THREADS"):
        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)
    # --hypothesis-profile (Hypothesis' own plugin) wins over the environment variable.
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))
    try:
        probe_plugins(config.getoption("plugin"))  # a plugin that ends the process would end the session as a pass
        config.stash[_PLUGINS_KEY] = load_plugins(config.getoption("plugin"))
        config.stash[_TARGET_KEY] = from_env(config.getoption("target")).require()
    except (TargetError, PluginError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_PROVENANCE_KEY] = provenance(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with coverage.tally() as observed:
        result = yield
    if observed.shares:  # shown with -rP: how often each declared case was exercised
        item.add_report_section("call", "vacuity floors", "\n".join(observed.lines()))
    # A profile of a few examples per test (fast, dev) looks for bugs; coverage is judged under the larger ones.
    shortfalls = observed.shortfalls() if settings().max_examples >= coverage.MIN_EXAMPLES else []
    if shortfalls:
        from oracle.checks import NUMERICS_LAW

        pytest.fail(
            "too many vacuous examples (oracle.coverage): the examples too rarely reached the cases this property is "
            "about, so its law went unchecked:\n  " + "\n  ".join(shortfalls) + "\nIf only the target changed (a "
            f"kernel, a plugin), its numerics may steer the examples off these cases (other tokens, no EOS); "
            f"{NUMERICS_LAW}",
            pytrace=False,
        )
    return result


REPRODUCE = re.compile(r"@reproduce_failure\('([^']+)', b'([^']+)'\)")


def cost_tier(item: pytest.Item) -> int:
    """0 op-level, 1 tiny models, 2 statistical, 3 the real model or slow: the order a session runs them in."""
    marks = {mark.name for mark in item.iter_markers()}
    if marks & {"model", "slow"}:
        return 3
    if "statistical" in marks:
        return 2
    return 0 if "kernel" in marks else 1


@pytest.hookimpl(trylast=True)  # after pytest's own reordering by fixture scope, which a stable sort keeps per tier
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=cost_tier)
    replay = config.getoption("replay")
    if not replay:
        return
    version, sep, blob = replay.partition(":")
    if not sep or not blob:
        raise pytest.UsageError(f"--replay {replay!r}: use VERSION:BLOB, as a failure's replay line prints it")
    for item in items:
        test = getattr(item, "obj", None)
        if getattr(test, "is_hypothesis_test", False):
            test._hypothesis_internal_use_reproduce_failure = (version, blob)  # type: ignore[union-attr]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failure found by Hypothesis gets one line that replays it: the test id, target, plugins and example."""
    report: pytest.TestReport = yield
    if report.failed and call.when == "call":
        found = REPRODUCE.search(report.longreprtext)
        if found:
            config = item.config
            target = config.stash[_TARGET_KEY].name
            parts = [f"python -m pytest {shlex.quote(item.nodeid)}", f"--target {shlex.quote(target)}"]
            parts += [f"--plugin {shlex.quote(name)}" for name in plugin_names(config.getoption("plugin"))]
            parts.append(f"--replay {shlex.quote(found.group(1) + ':' + found.group(2))}")
            report.sections.append(("replay", " ".join(parts)))
    return report


def provenance(config: pytest.Config) -> dict[str, str]:
    """What ran, as name -> value: the target, each plugin's file, sha256 and version, the allow-listed
    environment (oracle.provenance) and the session's UTC start; the header and JUnit's properties."""
    from oracle.provenance import plugin_files, recorded_env, utc_timestamp

    target = config.stash[_TARGET_KEY]
    fields = ", ".join(f"{k}={v}" for k, v in target.describe().items() if k != "name")
    out = {"target": f"{target.name} ({fields})"}
    loaded: list[str] = config.stash[_PLUGINS_KEY]
    for plugin in plugin_files(loaded):
        digest = plugin.sha256[:16] if plugin.sha256 else "-"
        out[f"plugin {plugin.module}"] = f"{plugin.file or 'no file'}, sha256 {digest}, version {plugin.version or '-'}"
    out.update({f"env {name}": value for name, value in recorded_env().items()})
    out["started (UTC)"] = utc_timestamp()
    return out


def header_lines(config: pytest.Config) -> list[str]:
    return [f"{name}: {value}" for name, value in config.stash[_PROVENANCE_KEY].items()]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return header_lines(config)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Bound shrinking for the active profile; provenance into --junitxml's properties; under -q, where pytest
    hides the header, still say what runs."""
    from hypothesis.internal.conjecture import engine as conjecture

    profile = settings.get_current_profile_name()
    conjecture.MAX_SHRINKING_SECONDS = SHRINK_SECONDS.get(profile, DEFAULT_SHRINK_SECONDS)
    xml = session.config.stash.get(xml_key, None)
    if xml is not None:  # --junitxml: the provenance as the test suite's properties
        for name, value in session.config.stash[_PROVENANCE_KEY].items():
            xml.add_global_property(name, value)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not reporter.showheader:
        for line in header_lines(session.config):
            reporter.write_line(line)


@pytest.fixture(scope="session")
def target(pytestconfig: pytest.Config) -> Target:
    """The target under test (--target)."""
    return pytestconfig.stash[_TARGET_KEY]


def device_target(config: pytest.Config, device: str) -> Target:
    """The target of a suite of one device (the GPU tests, a benchmark's cases): the session's where --target or
    $HFPARITY_TARGET names one, else the device's preset (target_spec.DEVICE_DEFAULTS); the calling test skips where
    the named target runs on another device or the preset cannot run here."""
    from oracle.target import parse

    named = config.stash[_TARGET_KEY] if named_text(config.getoption("target")) else None
    if named is not None and named.device != device:
        pytest.skip(f"target {named.name!r} runs on {named.device}, these tests on {device}")
    target = named or parse(DEVICE_DEFAULTS[device])
    problems = target.problems()
    if problems:
        pytest.skip(f"target {target.name!r} cannot run here: " + "; ".join(problems))
    return target


@pytest.fixture(scope="session")
def gpu_target(pytestconfig: pytest.Config) -> Target:
    """The target of the GPU tests (device_target of cuda: the named one, else cuda-bf16)."""
    return device_target(pytestconfig, "cuda")


@pytest.fixture(scope="session")
def op_bench(pytestconfig: pytest.Config, target: Target) -> Bench:
    """The target's implementations for the op-level properties; what ran is summed up at the end of the session."""
    from oracle.ops.bench import Bench
    from oracle.ops.ledger import Ledger

    return Bench(target, pytestconfig.stash.setdefault(_LEDGER_KEY, Ledger()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    ledger = config.stash.get(_LEDGER_KEY, None)
    if ledger is not None and ledger.counts:
        terminalreporter.section("op level: the implementation that ran, examples per op")
        for line in ledger.lines():
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, target: Target) -> dict[str, Path]:
    """arch -> the deterministic tiny random model (oracle.zoo) at the target's head_dim, built once per session."""
    from oracle.zoo import TINY_ARCHS, tiny_model_dir

    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: tiny_model_dir(arch, root, head_dim=target.head_dim) for arch in TINY_ARCHS}


@pytest.fixture(scope="session")
def qwen3(tiny_models: dict[str, Path]) -> Path:
    return tiny_models["qwen3"]


@pytest.fixture(scope="session")
def smollm2() -> Path:
    from oracle.zoo import smollm2_dir

    return smollm2_dir(progress=False)


@pytest.fixture(scope="session")
def engines(target: Target) -> Iterator[EnginePool]:
    """The target's engines, shut down at the end of the session."""
    from oracle.drive import EnginePool

    pool = EnginePool(target)
    yield pool
    pool.close()


class OraclePool:
    """oracle(model_dir, dtype=float64, device="cpu") -> the session's HFOracle for it (built once, results cached)."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, torch.dtype, str], HFOracle] = {}

    def __call__(self, model: str | Path, dtype: torch.dtype | None = None, device: str = "cpu") -> HFOracle:
        import torch

        from oracle.hf import HFOracle

        dtype = torch.float64 if dtype is None else dtype
        key = (str(model), dtype, device)
        if key not in self._cache:
            self._cache[key] = HFOracle(model, dtype=dtype, device=device)
        return self._cache[key]


@pytest.fixture(scope="session")
def oracle() -> OraclePool:
    return OraclePool()
