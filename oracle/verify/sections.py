"""The deterministic sections of verify: greedy parity and logit error against HF float64, decode ≡ prefill,
split prefill ≡ prefill, seeded sampling and bitwise bf16 RMSNorm; each returns its :class:`Check` list, and every
engine comes from the target (:func:`build_engine`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from engine import Engine, NonFiniteLogitsError, SamplingParams
from engine.driver import Generation, PageLayout, StaticDriver
from engine.layers.norm import RMSNorm

from ..checks import Mismatch, forced_greedy_mismatches, worst_logit_error
from ..hf import HFOracle
from ..ops.bench import kernel_ulps
from ..target import Target, from_env
from ..tolerance import YARDSTICK_RATIO, LogitTolerance, logits_error, rounding_bound
from .plan import MAX_SEQ_LEN, PAGE_SIZE
from .result import Check

NORM_SCALES = (0.02, 1.0, 50.0)  # input magnitudes for the bf16 norm check: small, unit, large activations

Advance = Callable[[str], None]


def completed(gens: Sequence[Generation]) -> list[Generation]:
    """The generations, unless the driver had to finish one with an error: then the error it finished with."""
    for gen in gens:
        if gen.finish_reason == "error":
            raise NonFiniteLogitsError(gen.error or f"request {gen.uid} finished with an error", [], [gen.uid])
    return list(gens)


def build_engine(target: Target, model: Path, rows: int, seed: int = 0, **fields: Any) -> Engine:
    """An engine of the target for `rows` concurrent sequences of up to MAX_SEQ_LEN tokens; fields override."""
    config = target.engine_config(
        model,
        page_size=PAGE_SIZE,
        max_running_req=rows,
        max_seq_len_override=MAX_SEQ_LEN,
        num_page_override=rows * MAX_SEQ_LEN // PAGE_SIZE,
        **fields,
    )
    return Engine(config, sampler_seed=seed)


def require_finite(logits: torch.Tensor, what: str) -> None:
    """Raise NonFiniteLogitsError naming the rows of `logits` ([rows, vocab]) holding NaN or inf."""
    bad = (~torch.isfinite(logits)).flatten(1).any(-1)
    if bool(bad.any()):
        rows = [int(i) for i in bad.nonzero().flatten()]
        raise NonFiniteLogitsError(f"{what}: the engine produced non-finite logits in rows {rows}", rows, [])


def _token_line(side: str, tokens: Sequence[int], decode: Callable[[Sequence[int]], str | None]) -> str:
    text = decode(tokens)
    return f"  {side}: {list(tokens)}" + (f" {text!r}" if text is not None else "")


def _greedy_detail(
    mismatches: Sequence[Mismatch],
    tokens: Sequence[int],
    hf_rows: torch.Tensor,
    label: Callable[[int], str],
    decode: Callable[[Sequence[int]], str | None],
) -> str:
    """The first and the worst mismatching position, then both sides' tokens (HF's: its argmax at each step,
    teacher-forced on the engine's prefix)."""
    first, worst = mismatches[0], max(mismatches, key=lambda m: m.gap)
    lines = [
        f"{len(mismatches)} of {len(tokens)} positions mismatch; first at position {first.position}, worst at "
        f"position {worst.position} ({worst.gap:.3g} below the best)"
    ]
    shown = [("first", first)] if worst is first else [("first", first), ("worst", worst)]
    for what, m in shown:
        lines.append(f"  {what}: position {m.position}: {m.reason(label)}")
    lines.append(_token_line("engine   ", tokens, decode))
    lines.append(_token_line("HF argmax", [int(r.argmax()) for r in hf_rows], decode))
    return "\n".join(lines)


def check_greedy_and_logits(
    gens: Sequence[Generation],
    prompts: Sequence[list[int]],
    labels: Sequence[str],
    hf: HFOracle,
    yardstick: HFOracle | None,
    tol: LogitTolerance,
    token_label: Callable[[int], str],
    decode: Callable[[Sequence[int]], str | None],
    advance: Advance,
) -> list[Check]:
    """Per prompt: the engine's greedy tokens against HF float64 teacher-forced on them, and the logit error of
    every generated row; yardstick: HF at the engine's dtype, whose own error widens the bound (oracle.tolerance)."""
    checks = []
    for gen, prompt, label in zip(gens, prompts, labels):
        engine_rows = torch.stack(gen.logits)
        require_finite(engine_rows, f"greedy generation of {label}")
        tokens = [*prompt, *gen.output_ids]
        span = slice(len(prompt) - 1, len(prompt) - 1 + len(gen.output_ids))
        rows = hf.teacher_forced_logits(tokens)[span]
        mismatches = forced_greedy_mismatches(gen.output_ids, gen.logits, rows, tol)
        detail = (
            _greedy_detail(mismatches, gen.output_ids, rows, token_label, decode)
            if mismatches
            else f"{len(gen.output_ids)} tokens, each HF float64's argmax or a near-tie of it"
        )
        checks.append(Check.measured("greedy parity", label, float(len(mismatches)), 0.0, "==", detail))
        worst = worst_logit_error(engine_rows, rows)
        position, token = worst.index
        detail = (
            f"{len(rows)} positions vs HF float64, rel {tol.rel:g}; worst at position {position} (logit of token "
            f"{token_label(token)}): engine {worst.actual:.6g} vs HF {worst.reference:.6g}"
        )
        own = None
        if yardstick is not None:
            own = logits_error(yardstick.teacher_forced_logits(tokens)[span], rows)
            dtype = str(yardstick.dtype).removeprefix("torch.")
            detail += f"; HF's own {dtype} error {own:.3g} (bound: rel's, or {YARDSTICK_RATIO:g}x that if larger)"
        bound = tol.yardstick_bound(rows, own)
        checks.append(Check.measured("logit error", label, worst.value, bound, "<=", detail))
        advance(f"HF float64 on {label}")
    return checks


def _row_check(
    section: str,
    name: str,
    where: str,
    sides: tuple[str, str],
    rows: tuple[torch.Tensor, torch.Tensor],
    bound: float,
    label: Callable[[int], str],
) -> Check:
    """Two logit rows of one position held to `bound`; the detail names where, both argmaxes and the worst logit."""
    (a, b), (row_a, row_b) = sides, rows
    worst = worst_logit_error(row_a, row_b)
    (token,) = worst.index
    detail = (
        f"{where}; argmax: {a} {label(int(row_a.argmax()))}, {b} {label(int(row_b.argmax()))}; worst at token "
        f"{label(token)}: {a} {worst.actual:.6g} vs {b} {worst.reference:.6g}"
    )
    return Check.measured(section, name, worst.value, bound, "<=", detail)


def check_prefill_consistency(
    engine: Engine,
    gens: Sequence[Generation],
    prompts: Sequence[list[int]],
    labels: Sequence[str],
    tol: LogitTolerance,
    token_label: Callable[[int], str],
) -> list[Check]:
    """At each prompt's last step s: the decode row against a fresh prefill of prompt + tokens[:s], and that
    prefill against the same prefix prefilled in two chunks (the prompt, then the s tokens as one extend)."""
    prefixes = [[*prompt, *gen.output_ids[:-1]] for prompt, gen in zip(prompts, gens)]
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    single = completed(StaticDriver(engine, PageLayout("interleaved"), record_logits=True).generate(prefixes, params))
    split = StaticDriver(engine, PageLayout("shuffled", 1), record_logits=True)
    uids = [split.add(pre, params, chunk_sizes=[len(p), len(pre) - len(p)]) for pre, p in zip(prefixes, prompts)]
    split.run()
    checks = []
    for gen, one, two, label, prefix in zip(gens, single, completed([split.result(u) for u in uids]), labels, prefixes):
        step, position = len(gen.output_ids) - 1, len(prefix) - 1
        prefilled, extended = one.logits[0], two.logits[0]
        require_finite(torch.stack([prefilled, extended]), f"prefill of {label}")
        bound = tol.bound(prefilled)
        where = f"decode step {step}, position {position}: the decode row vs one prefill of the {len(prefix)} tokens"
        rows = (gen.logits[step], prefilled)
        checks.append(_row_check("decode ≡ prefill", f"{label}, step {step}", where, ("decode", "prefill"), rows,
                                 bound, token_label))
        where = (
            f"position {position}: the prompt's {len(prefix) - step} tokens then {step} as one extend, vs one "
            f"prefill of the {len(prefix)}"
        )
        checks.append(_row_check("split prefill ≡ prefill", f"{label}, extend of {step} tokens", where,
                                 ("split", "prefill"), (extended, prefilled), bound, token_label))
    return checks


def check_seeded(engine: Engine, prompts: Sequence[list[int]], labels: Sequence[str], seed: int) -> list[Check]:
    """Seeded requests give the same tokens whatever the engine generator's state and the batch order."""
    two = list(prompts[:2])
    # Modulo 2**63, the engine's seed range: any run seed (verify takes [0, 2**63)) gives two valid request seeds.
    seeds = [(seed * 1000 + i + 1) % 2**63 for i in (0, 1)]
    params = [SamplingParams(temperature=1.5, seed=s, max_tokens=6, ignore_eos=True) for s in seeds]
    engine.sampler.reseed(seed)
    first = completed(StaticDriver(engine).generate(two, params))
    engine.sampler.reseed(seed + 1)
    second = completed(StaticDriver(engine, PageLayout("shuffled", seed)).generate(two[::-1], params[::-1]))[::-1]
    checks = []
    for a, b, p, label in zip(first, second, params, labels):
        differ = sum(x != y for x, y in zip(a.output_ids, b.output_ids)) + abs(len(a.output_ids) - len(b.output_ids))
        detail = f"run 1 {a.output_ids}, run 2 (other generator state, batch reversed) {b.output_ids}"
        checks.append(Check.measured("seeded sampling", f"{label}, seed {p.seed}", float(differ), 0.0, "==", detail))
    return checks


def check_bf16_norms(model: Path, seed: int, target: Target | None = None, hf: HFOracle | None = None) -> list[Check]:
    """Every RMSNorm of a bf16 engine on the target's device against the HF module of the same name, on shared bf16
    inputs (made on the CPU, moved to the device): bitwise where the torch reference kernels serve RMSNorm, else
    within their contract (oracle.ops.bench.kernel_ulps). target: default $HFPARITY_TARGET's; hf: an HFOracle in
    bf16 on that device (built here if None)."""
    target = target or from_env()
    device = target.torch_device
    hf = hf or HFOracle(model, dtype=torch.bfloat16, device=target.device)
    engine = build_engine(target, model, rows=1, dtype="bfloat16", cuda_graph_bs=[])
    ulps = kernel_ulps(engine.ctx.kernels, "rms_norm", str(target.resolved("kernels")))
    worst: tuple[float, str] | None = None
    try:
        hf_model = hf.model
        gen = torch.Generator().manual_seed(seed)
        mismatched, differ, compared, modules, missing = 0, 0, 0, 0, []
        with torch.inference_mode():
            for name, module in engine.model.named_modules():
                if not isinstance(module, RMSNorm):
                    continue
                try:
                    reference = hf_model.get_submodule(name)
                except AttributeError:
                    missing.append(name)
                    continue
                modules += 1
                for scale in NORM_SCALES:
                    x = (torch.randn(8, module.weight.numel(), generator=gen) * scale).to(device, torch.bfloat16)
                    ours, theirs = module(x, engine.ctx), reference(x)
                    gap = (ours.double() - theirs.double()).abs()
                    outside = ~(gap <= rounding_bound(theirs, torch.bfloat16, ulps))
                    mismatched += int(outside.sum())
                    differ += int((ours != theirs).sum())
                    compared += ours.numel()
                    at = int(gap.flatten().nan_to_num(nan=float("inf")).argmax())
                    if worst is None or gap.flatten()[at] > worst[0]:
                        i, j = divmod(at, ours.shape[1])
                        where = f"worst: {name} at input scale {scale:g}, element ({i}, {j})"
                        worst = (float(gap.flatten()[at]), f"{where}: engine {float(ours[i, j])!r} vs HF "
                                 f"{float(theirs[i, j])!r}")
    finally:
        engine.shutdown()
    contract = "bitwise" if ulps == 0 else f"within {ulps} ulp"
    section, what = "bf16 norms", f"RMSNorm modules vs HF in bf16, {contract}"
    if missing:
        return [Check(section, what, "fail", detail=f"HF has no module named {missing}")]
    if modules == 0:
        return [Check(section, what, "fail", detail="the engine model has no RMSNorm module")]
    detail = (
        f"{modules} modules x {len(NORM_SCALES)} input scales on {target.device} (layer kernels {target.kernels}): "
        f"{mismatched} of {compared} outputs outside the contract ({differ} differ at all)"
        + (f"; {worst[1]}" if worst and differ else "")
    )
    return [Check.measured(section, what, float(mismatched), 0.0, "==", detail)]
