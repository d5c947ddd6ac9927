"""The kernels section: every replaceable kernel of the target (layer kernels, step kernels, the attention backend's
prefill, extend and decode, the sampler's filtered probabilities and seeded draws) called alone by its op-level
check (:mod:`oracle.ops`) on a fixed number of Hypothesis-drawn boundary inputs, derandomized from the run's seed,
at the model's head_dim. One check per op: pass, fail (the check's AssertionError names the op, the call's shapes
and dtype and the worst element with both values) or error (anything else the op raised); its value is the number
of examples run, and its detail ends with the ledger's line: which implementation each example reached (a declared
fallback shows there; an undeclared one fails the op).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st

from ..ops import attention, kv_store, layers, sampler, step
from ..ops.bench import Bench
from ..target import Target
from .result import Check, Status

SECTION = "kernels"
FAILURE_LINES = 4  # of the AssertionError: the op, the call, the worst element and both values
RAN = "ran: "  # prefixes the ledger's line in a failed check's detail


@dataclass(frozen=True)
class KernelOp:
    name: str  # as the op-level check files it in the ledger
    cases: Callable[[Bench], st.SearchStrategy[Any]]
    check: Callable[[Bench, Any], None]


def _attention(phase: str) -> KernelOp:
    return KernelOp(
        f"attention {phase}", lambda b: attention.attn_cases(b.target.page_sizes, phase), attention.check_attention
    )


KERNEL_OPS = (
    KernelOp("rms_norm", lambda b: layers.norm_cases(b.dtype), layers.check_rms_norm),
    KernelOp("add_rms_norm", lambda b: layers.norm_cases(b.dtype, with_residual=True), layers.check_add_rms_norm),
    KernelOp("norm_rope", lambda b: layers.rope_cases(b.dtype, b.target.head_dim), layers.check_norm_rope),
    KernelOp("silu_and_mul", lambda b: layers.gate_up_cases(b.dtype), layers.check_silu_and_mul),
    KernelOp("linear", lambda b: layers.linear_cases(b.dtype), layers.check_linear),
    KernelOp(
        "store_kv",
        lambda b: kv_store.store_cases(b.dtype, b.target.head_dim, kv_store.big_pools_fit(b.device)),
        kv_store.check_store_kv,
    ),
    KernelOp(
        "norm_rope_store",
        lambda b: kv_store.rope_store_cases(b.dtype, b.target.head_dim, kv_store.big_pools_fit(b.device)),
        kv_store.check_norm_rope_store,
    ),
    KernelOp("input_ids", lambda b: step.input_ids_cases(), step.check_input_ids),
    KernelOp("greedy_step", lambda b: step.greedy_cases(), step.check_greedy_step),
    KernelOp("keep_tokens", lambda b: step.keep_cases(), step.check_keep_tokens),
    KernelOp("hand_out", lambda b: step.hand_out_cases(), step.check_hand_out),
    KernelOp("slot_check", lambda b: step.slot_cases(b.target.page_sizes), step.check_slot_check),
    _attention("prefill"),
    _attention("extend"),
    _attention("decode"),
    KernelOp("sampler probs", lambda b: sampler.probs_cases(), sampler.check_sampler_probs),
    KernelOp("sampler seeded draw", lambda b: sampler.seed_cases(), sampler.check_seeded_draws),
)


def implementation_line(bench: Bench, op: str) -> str:
    """The ledger's count for `op`, e.g. ``kernels=triton x12, kernels=torch (declared: ...) x3``."""
    counts = bench.ledger.counts.get(op)
    if not counts:
        return "no implementation reached"
    return ", ".join(f"{impl} x{n}" for impl, n in counts.most_common())


def check_op(op: KernelOp, target: Target, examples: int, seed: int) -> Check:
    """Run `op`'s check on `examples` drawn inputs (shrunk on failure) and file the verdict as one Check."""
    bench = Bench(target)
    ran = 0

    @hypothesis.seed(seed)
    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink),
        report_multiple_bugs=False,  # one exception, the shrunk one, rather than a group
        verbosity=Verbosity.quiet,  # the check's message carries the example; the console stays the report's
        print_blob=False,
    )
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        nonlocal ran
        case = data.draw(op.cases(bench), label="case")
        ran += 1
        op.check(bench, case)

    status: Status = "pass"
    try:
        run()
    except AssertionError as exc:
        status, message = "fail", "\n".join(str(exc).splitlines()[:FAILURE_LINES])
    except Exception as exc:  # a kernel that raises is this op's error; the other ops still run
        status, message = "error", f"{type(exc).__name__}: {' '.join(str(exc).split()) or '(no message)'}"
    line = implementation_line(bench, op.name)
    detail = line if status == "pass" else f"{message}\n{RAN}{line}"
    return Check(SECTION, op.name, status, float(ran), detail=detail)


def check_kernels(target: Target, head_dim: int, examples: int, seed: int) -> list[Check]:
    """One check per op of KERNEL_OPS, on `target` at the model's `head_dim`."""
    at_model = dataclasses.replace(target, head_dim=head_dim)
    return [check_op(op, at_model, examples, seed) for op in KERNEL_OPS]


def ran_line(check: Check) -> str:
    """The implementation line of a kernels check: its detail's last line."""
    return check.detail.splitlines()[-1].removeprefix(RAN) if check.detail else ""
