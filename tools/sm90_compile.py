"""Compile every Triton kernel the kernel tests launch for a CUDA GPU, on a machine without one: the tests of
``tests/gpu`` run with ``KERNEL_TEST_DEVICE=cpu`` and outside Triton's interpreter, each launch is compiled for the
target (sm_90 unless --arch says otherwise; programmatic dependent launch on, as on Hopper) by the triton wheel's own
compiler and ptxas, and nothing runs. The tests' assertions then see unwritten outputs, so only compile errors count:
the interpreter accepts code the compiler refuses (an int argument equal to 1 made a constant, a dot under 16 rows).
The report names every kernel compiled; kernels whose tests need CUDA itself (the seeded noise, SiLU-and-mul) are
not reached. Needs triton with its NVIDIA backend.
Run: ``python tools/sm90_compile.py [pytest args, default tests/gpu]``.
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from typing import Any

os.environ["KERNEL_TEST_DEVICE"] = "cpu"
os.environ.pop("TRITON_INTERPRET", None)  # read when triton is imported

import pytest  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402


class CompileOnlyDriver:
    """The driver Triton asks for a device, a stream and the target: device 0, no stream, the given target."""

    def __init__(self, target: GPUTarget) -> None:
        self.target = target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target


def _pdl_always(x: Any) -> bool:
    return True


class CompilePlugin:
    """Swaps the launch for a compile (warmup) and records, per kernel, its compiled specializations and errors."""

    def __init__(self, arch: int) -> None:
        self.arch = arch
        self.compiled: dict[str, int] = defaultdict(int)
        self.errors: dict[str, list[str]] = defaultdict(list)
        self._run = JITFunction.run
        self._active = driver._active  # None until first asked for: asking would fail without a GPU
        self._pdl_on: dict[Any, Any] = {}  # engine module -> the pdl_on it had

    def pytest_configure(self, config: pytest.Config) -> None:
        driver.set_active(CompileOnlyDriver(GPUTarget("cuda", self.arch, 32)))
        plugin = self

        def compile_only(kernel: JITFunction, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            name = f"{kernel.module}.{kernel.fn.__qualname__}"
            try:
                compiled = plugin._run(kernel, *args, grid=grid, warmup=True, **kwargs)
            except Exception as exc:  # a compile error is the finding: record it, let the test go on
                plugin.errors[name].append(f"{type(exc).__name__}: {exc}"[:2000])
                return None
            plugin.compiled[name] += 1
            return compiled

        JITFunction.run = compile_only  # type: ignore[method-assign]
        self._enable_pdl()

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self._enable_pdl()  # modules imported during collection bound the original

    def _enable_pdl(self) -> None:
        from engine.layers import triton_pdl

        original = self._pdl_on.get(triton_pdl, triton_pdl.pdl_on)
        for name, module in list(sys.modules.items()):
            # A module imported after the first patch bound the patch itself: it is restored too.
            if name.split(".")[0] == "engine" and vars(module).get("pdl_on") in (original, _pdl_always):
                self._pdl_on[module] = original
                module.pdl_on = _pdl_always  # type: ignore[attr-defined]

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        JITFunction.run = self._run  # type: ignore[method-assign]
        driver._active = self._active
        for module, pdl_on in self._pdl_on.items():
            module.pdl_on = pdl_on

    def report(self) -> int:
        for name in sorted(set(self.compiled) | set(self.errors)):
            print(f"{name}: {self.compiled[name]} compiled, {len(self.errors[name])} failed")
            for error in dict.fromkeys(self.errors[name]):
                print("    " + error.replace("\n", "\n    "))
        failed = sum(len(e) for e in self.errors.values())
        print(f"sm_{self.arch}: {sum(self.compiled.values())} launches compiled over {len(self.compiled)} kernels, "
              f"{failed} failed to compile")
        return 1 if failed or not self.compiled else 0


def main(argv: list[str]) -> int:
    arch = 90
    if argv[:1] == ["--arch"]:
        arch, argv = int(argv[1]), argv[2:]
    plugin = CompilePlugin(arch)
    pytest.main([*(argv or ["tests/gpu"]), "-q", "--tb=no", "--no-summary", "-p", "no:cacheprovider"], plugins=[plugin])
    return plugin.report()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
