"""``python -m oracle verify --model DIR``: the engine against HF on one model dir, for the chosen target — greedy
parity and logit error against HF float64, decode ≡ prefill, split prefill ≡ prefill, seeded sampling, bitwise bf16
RMSNorm (:mod:`.sections`), attention scores past float32's exp overflow (:mod:`.magnitude`) and chi-square /
support tests of the target's sampler over a grid of sampling params (:mod:`.statistics`), and every replaceable kernel
called alone on drawn boundary inputs with the implementation that ran (:mod:`.kernels`), planned by :mod:`.plan`
(short prompts and a long one), each run on its own by :mod:`.runner` (an error in one leaves the others running),
collected in a :class:`VerifyResult` and rendered by :mod:`.report` and :mod:`.junit`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from engine import SamplingParams
from engine.driver import PageLayout, StaticDriver

from ..environment import Environment, environment
from ..hf import HFOracle
from ..provenance import plugin_files, recorded_env, utc_timestamp
from ..stats import FAMILY_ALPHA, AlphaBudget
from ..target import Target, from_env
from .kernels import check_kernels
from .magnitude import check_large_magnitude
from .plan import FULL, QUICK, Plan, load_tokenizer, make_prompts, steps_of, text_decoder, token_labeler
from .result import STATUSES, Check, Figure, PassesWhen, Status, VerifyResult, rerun_command
from .runner import OnSection, SectionRun, Sections
from .sections import (
    build_engine,
    check_bf16_norms,
    check_greedy_and_logits,
    check_prefill_consistency,
    check_seeded,
    completed,
)
from .statistics import (
    SamplingCase,
    boundary_cases,
    bucketed_tokens,
    check_sampling,
    chi_square_check,
    detectable_w,
    sampling_cases,
)

__all__ = [
    "FULL",
    "QUICK",
    "STATUSES",
    "Check",
    "Environment",
    "Figure",
    "PassesWhen",
    "Plan",
    "SectionRun",
    "SamplingCase",
    "Status",
    "VerifyResult",
    "boundary_cases",
    "bucketed_tokens",
    "check_bf16_norms",
    "chi_square_check",
    "detectable_w",
    "sampling_alpha",
    "sampling_cases",
    "steps_of",
    "verify",
]

GREEDY = "greedy generation"


def sampling_alpha(plan: Plan) -> float:
    """α per statistical test: the family budget (1e-3 per run) split by Bonferroni over the plan's chi-square and
    support checks."""
    return AlphaBudget(tests=2 * plan.sampling_cases, total=FAMILY_ALPHA).per_test


def verify(
    model: str | Path,
    quick: bool = False,
    seed: int = 0,
    advance: Callable[[str], None] | None = None,
    target: Target | None = None,
    plugins: Sequence[str] = (),
    catch_errors: bool = True,
    *,
    on_section: OnSection | None = None,
    target_text: str | None = None,
    record_env: Sequence[str] = (),
) -> VerifyResult:
    """Run every section on `model` for `target` (default: $HFPARITY_TARGET's, else cpu-fp32).

    Before the run, a target that cannot run here raises TargetError and a bad model dir EngineError / OSError.
    Once the engine and HF are loaded, each section runs guarded (:mod:`.runner`): an exception becomes a check
    with status "error" in section "run" and the later sections still run, or it propagates with
    catch_errors=False. on_section: called as each section finishes. plugins: the plugin modules loaded;
    target_text: how the target was named (default its name), both for the provenance and the rerun line;
    record_env: names or prefixes (ending in *) of environment variables to record besides oracle.provenance's.
    """
    step = advance or (lambda _: None)
    start, started = time.perf_counter(), utc_timestamp()
    target = (target or from_env()).require()
    model = Path(model)
    plan = QUICK if quick else FULL
    engine = build_engine(target, model, rows=plan.prompts + 1, seed=seed)  # + 1: the long prompt
    try:
        step("engine loaded")
        tokenizer = load_tokenizer(model)
        prompts, labels = make_prompts(tokenizer, plan.prompts, engine.model_config.vocab_size, seed)
        hf = HFOracle(model, dtype=torch.float64)
        hf.model  # noqa: B018 - load now, so the progress step measures it
        step("HF float64 loaded")
        hf_bf16 = HFOracle(model, dtype=torch.bfloat16, device=target.device)
        yardstick = None if engine.dtype == torch.float32 else hf_bf16  # Target.require: float32 or bfloat16
        dtype = str(engine.dtype).removeprefix("torch.")
        alpha = sampling_alpha(plan)
        result = VerifyResult(str(model), plan.name, target, dtype, seed, alpha, environment(target), list(plugins))
        result.started, result.prompts = started, prompts
        result.plugin_files, result.env = plugin_files(plugins), recorded_env(record_env)
        result.rerun = rerun_command(str(model), target_text or target.name, plugins, plan.name, seed)
        tol, token_label = target.tolerance, token_labeler(tokenizer)
        sections = Sections(catch_errors, step, on_section)
        greedy = SamplingParams(temperature=0.0, max_tokens=plan.max_tokens, ignore_eos=True)
        driver = StaticDriver(engine, PageLayout("shuffled", seed), record_logits=True)
        gens = sections.value(GREEDY, lambda: completed(driver.generate(prompts, greedy))) or []
        decode = text_decoder(tokenizer)
        sections.run("greedy parity and logit error", lambda: check_greedy_and_logits(
            gens, prompts, labels, hf, yardstick, tol, token_label, decode, step
        ), needs=[GREEDY])
        sections.run("decode and split prefill", lambda: check_prefill_consistency(
            engine, gens, prompts, labels, tol, token_label
        ), needs=[GREEDY])
        sections.run("seeded sampling", lambda: check_seeded(engine, prompts, labels, seed))
        sections.run("bf16 norms", lambda: check_bf16_norms(model, seed, target, hf_bf16))
        sections.run("large magnitude", lambda: check_large_magnitude(
            target, model, prompts[-1], labels[-1], hf, lambda variant: build_engine(target, variant, 1, seed)
        ))

        def sampling() -> list[Check]:
            # Each prompt's own row first; the later steps' rows serve where those leave one chi-square bucket.
            later = [
                (f"{label}, step {k}", g.logits[k]) for g, label in zip(gens, labels) for k in range(1, len(g.logits))
            ]
            rows = [g.logits[0] for g in gens] + [row for _, row in later]
            row_labels = list(labels) + [name for name, _ in later]
            cases = sampling_cases(rows, plan, first=len(gens))
            checks, result.figure = check_sampling(
                engine, rows, row_labels, cases, alpha, seed, token_label, step, plan.samples
            )
            return checks

        sections.run("sampling", sampling, needs=[GREEDY])
        sections.run("kernels", lambda: check_kernels(target, engine.model_config.head_dim, plan.kernel_examples, seed))
        result.checks = sections.checks
    finally:
        engine.shutdown()
    result.seconds = time.perf_counter() - start
    return result

