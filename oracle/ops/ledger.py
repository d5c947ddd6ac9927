"""Which implementation actually ran each op: the proof that an op-level example exercised the kernel under test.

While an op runs, a profile hook (``sys.setprofile``) sees every Python call and every Triton kernel launch and
files it under the implementation whose code it is (a :class:`Home`: the engine's built-ins are listed here, a
plugin's are the modules of the factories it registered). The op's own check names the implementation the target
should run and, where that implementation says it hands these arguments to another one (``LayerKernels.declines``,
``BaseAttnBackend.delegate``, the FlashInfer sampler's seeded rows), the declared reason. An example on which the
expected implementation never ran and nothing was declared is an undeclared fallback and fails. The ledger counts,
per op, how many examples reached each implementation; the pytest plugin prints it at the end of a session.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any

from engine import ATTENTION_BACKENDS, LAYER_KERNELS, SAMPLERS, STEP_KERNELS
from engine.registry import REFERENCE, Registry

REGISTRIES: dict[str, Registry[Any]] = {
    "kernels": LAYER_KERNELS, "step": STEP_KERNELS, "attention": ATTENTION_BACKENDS, "sampler": SAMPLERS,
}


@dataclass(frozen=True)
class Home:
    """Code that belongs to one implementation: calls into `module` (a trailing '.' makes it a package prefix)
    whose qualified name starts with one of `qualnames` (all, when empty); `launches`: only Triton kernels
    launched from `module` count (its Python helpers also run when it declines)."""

    label: str
    module: str
    qualnames: tuple[str, ...] = ()
    launches: bool = False

    def holds(self, module: str, qualname: str) -> bool:
        inside = module.startswith(self.module) if self.module.endswith(".") else module == self.module
        return inside and (not self.qualnames or qualname.startswith(self.qualnames))


def label(key: str, name: str) -> str:
    return f"{key}={name}"


BUILTIN_HOMES = (
    Home(label("kernels", "triton"), "engine.layers.triton_kernels", launches=True),
    Home(label("kernels", "triton"), "engine.layers.triton_gemv", launches=True),
    Home(label("kernels", "triton"), "engine.layers.triton_gemm", launches=True),
    Home(label("kernels", "triton"), "engine.attention.page_ids", launches=True),
    Home(label("kernels", "triton_invariant"), "engine.layers.triton_kernels", launches=True),
    Home(label("kernels", "triton_invariant"), "engine.layers.triton_matmul", launches=True),
    Home(label("kernels", "torch_invariant"), "engine.layers.kernels", ("InvariantKernels.", "blocked_linear")),
    Home(label("kernels", REFERENCE), "engine.layers.kernels",
         ("TorchKernels.", "LayerKernels.", "rms_norm_reference")),
    Home(label("kernels", REFERENCE), "engine.layers.activation"),
    Home(label("kernels", REFERENCE), "engine.layers.rotary", ("RotaryAt.apply", "_rotate")),
    Home(label("kernels", REFERENCE), "engine.attention.flashinfer_backend", ("graph_page_ids",)),
    Home(label("step", "triton"), "engine.step.triton", launches=True),
    Home(label("step", REFERENCE), "engine.step.kernels", ("TorchStepKernels.", "StepKernels.", "keep_tokens")),
    Home(label("step", REFERENCE), "engine.step.slots",
         ("redirected_slots", "slot_check", "slot_verdict", "slot_faults")),
    Home(label("step", REFERENCE), "engine.sample", ("greedy_tokens",)),
    Home(label("attention", "triton"), "engine.attention.triton_decode", launches=True),
    Home(label("attention", "triton_invariant"), "engine.attention.triton_decode", launches=True),
    Home(label("attention", REFERENCE), "engine.attention.torch_backend"),
    Home(label("attention", "flashinfer"), "flashinfer.", ("BatchPrefill", "BatchDecode")),
    Home(label("sampler", "flashinfer"), "flashinfer.sampling"),
    Home(label("sampler", REFERENCE), "engine.sample", ("Sampler.filtered_probs", "BaseSampler.noise")),
)


def plugin_homes() -> list[Home]:
    """One home per implementation registered outside the engine: the module its factory was defined in."""
    homes = []
    for key, registry in REGISTRIES.items():
        for name in registry.names():
            if name == "auto":
                continue
            module = getattr(registry.factory(name), "__module__", None) or ""
            if module and not module.startswith("engine."):
                homes.append(Home(label(key, name), module))
    return homes


@dataclass
class Seen:
    """The implementations whose code ran inside one observed call."""

    ran: set[str] = field(default_factory=set)


class Ledger:
    """Per op, how many examples reached each implementation (``counts[op][implementation]``)."""

    def __init__(self) -> None:
        self.counts: defaultdict[str, Counter[str]] = defaultdict(Counter)
        self._labels: dict[CodeType, tuple[str, ...]] = {}

    @contextmanager
    def observe(self) -> Iterator[Seen]:
        """Record which homes' code runs inside the block (the hook of an outer profiler is put back after)."""
        homes = [*plugin_homes(), *BUILTIN_HOMES]
        seen = Seen()
        previous = sys.getprofile()

        def hook(frame: FrameType, event: str, arg: object) -> None:
            if event == "call":
                seen.ran.update(self._classify(frame, homes))

        sys.setprofile(hook)
        try:
            yield seen
        finally:
            sys.setprofile(previous)

    def _classify(self, frame: FrameType, homes: list[Home]) -> tuple[str, ...]:
        code = frame.f_code
        module = frame.f_globals.get("__name__", "")
        if module.startswith("triton.runtime") and code.co_name == "run":
            kernel = getattr(frame.f_locals.get("self"), "fn", None)
            where = getattr(kernel, "__module__", "")
            return tuple(h.label for h in homes if h.launches and h.holds(where, ""))
        if code not in self._labels:
            self._labels[code] = tuple(
                dict.fromkeys(h.label for h in homes if not h.launches and h.holds(module, code.co_qualname))
            )
        return self._labels[code]

    def settle(self, op: str, seen: Seen, expected: str, declared: str | None) -> str:
        """File one example of `op` and return the implementation it is counted under; AssertionError for an
        undeclared fallback (`expected` never ran and nothing was declared)."""
        if expected in seen.ran:
            entry = expected
        elif declared is not None:
            entry = f"{'+'.join(sorted(seen.ran)) or 'nothing traced'} (declared: {declared})"
        else:
            ran = ", ".join(sorted(seen.ran)) or "no traced implementation"
            raise AssertionError(
                f"op {op}: undeclared fallback: the target's {expected} never ran on this example ({ran} did), and "
                "it declared no reason to hand it on (LayerKernels.declines, StepKernels.declines, "
                "BaseAttnBackend.delegate)"
            )
        self.counts[op][entry] += 1
        return entry

    def lines(self) -> list[str]:
        """The summary the pytest plugin prints: one line per op."""
        return [
            f"{op}: " + ", ".join(f"{impl} x{n}" for impl, n in counts.most_common())
            for op, counts in sorted(self.counts.items())
        ]


def expected_impl(obj: object, method: str, key: str, name: str, references: tuple[type, ...]) -> str:
    """The implementation that serves `obj.method`: the reference where the class that defines the method is one
    of the engine's reference classes (inherited, not overridden), else the target's `name`."""
    owner = next(c for c in type(obj).__mro__ if method in vars(c))
    return label(key, REFERENCE if owner in references else name)
