"""``python -m oracle verify --model DIR``: a verification report of the engine against HF on one model dir.

Sections (each a list of :class:`Check`):

* **greedy parity**: the engine's greedy tokens are HF's. HF's greedy choice at each step is the argmax of its
  float64 logits for the prefix so far; teacher-forcing HF on the engine's sequence gives exactly those rows, so
  by induction the engine's tokens equal HF ``generate`` (do_sample=False) unless a near-tie is met, where
  vLLM's rule applies (:func:`oracle.checks.check_forced_greedy`).
* **logit error**: max |engine - HF float64| over every generated position (prefill and decode rows), within the
  per-dtype bound of :mod:`oracle.tolerance`.
* **decode ≡ prefill**: the engine's decode logits at a step equal its own prefill logits of the same prefix.
* **split prefill ≡ prefill**: that prefix prefilled in two chunks (the prompt, then the generated tokens as one
  extend with cached_len > 0) gives the same logits as one prefill.
* **seeded sampling**: seeded requests repeat their tokens with another engine-generator state and batch order.
* **bf16 norms**: every RMSNorm of the engine built in bfloat16 is bitwise HF's RMSNorm in bfloat16 (HF computes
  the mean of squares and rsqrt in float32). In float32 this rule is unobservable; in bf16 end-to-end logits
  it drowns in bf16's own rounding, so it is checked where it is exact: module by module, on the model's weights.
* **sampling**: for each point of a grid of sampling params (two placed on the boundaries where filter semantics
  differ, see :func:`boundary_cases`), the engine's sampler draws N tokens from the engine's logits row in mixed
  batches (greedy rows interleaved); the counts pass a chi-square test and a support check against
  :func:`oracle.sampler.reference_distribution`, and every greedy row is the argmax. α per test is the family
  budget (1e-3 per run) split by Bonferroni over the run's statistical tests.

Logit bounds are ``rel * max(1, max |ref|)`` per engine dtype (:mod:`oracle.tolerance`, float32: rel 5e-5).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine import Batch, Engine, EngineConfig, Req, SamplingParams
from engine.driver import Generation, PageLayout, StaticDriver
from engine.layers.norm import RMSNorm
from oracle.checks import check_forced_greedy
from oracle.hf import HFOracle
from oracle.sampler import reference_distribution
from oracle.stats import FAMILY_ALPHA, AlphaBudget, chi_square_gof, power, support_check
from oracle.tolerance import logit_tolerance, logits_error

PROMPTS = (
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
    "To make a cup of tea, first",
)
RANDOM_PROMPT_LENGTHS = (5, 12, 23, 31, 40, 47)  # page_size 4: on, before and after page boundaries
PAGE_SIZE = 4
MAX_SEQ_LEN = 128
GREEDY_EVERY = 8  # one greedy row in every 8 of a sampling batch
CHUNK_ROWS = 256  # rows per sampling batch: bounded memory on a 50k vocabulary
NORM_SCALES = (0.02, 1.0, 50.0)  # input magnitudes for the bf16 norm check: small, unit, large activations


@dataclass(frozen=True)
class Plan:
    name: str
    prompts: int
    max_tokens: int
    samples: int  # draws per sampling test
    grid: tuple[SamplingParams, ...]


def _sp(temperature: float, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0) -> SamplingParams:
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


# Fixed grid points, besides the two boundary points every plan adds (boundary_cases).
# Temperature and min-p appear alone, top-p alone at a boundary point, top-k with top-p; T != 1 wherever min-p is
# on, so a threshold taken before temperature shows. Draws per test: on SmolLM2's 49k vocabulary the engine's
# sampler sorts every row (~4 ms a draw on 2 cores), so the full plan takes 1200, enough to detect Cohen's
# w ~ 0.2 with 90% power at df ~ 20 (each check states its own detectable w); the gross errors real bugs make
# (a dropped or added token of real mass, a wrong order of filters) show at a few hundred.
FULL = Plan(
    "full",
    prompts=6,
    max_tokens=16,
    samples=1200,
    grid=(
        _sp(0.8, top_k=40, top_p=0.9),
        _sp(0.7),
        _sp(1.2, min_p=0.05),
        _sp(1.3, top_k=100, top_p=0.95, min_p=0.02),
    ),
)
QUICK = Plan(
    "quick",
    prompts=3,
    max_tokens=8,
    samples=1500,
    grid=(_sp(1.0, top_p=0.9), _sp(1.2, min_p=0.05)),
)


@dataclass(frozen=True)
class Check:
    section: str
    name: str
    passed: bool
    value: float | None = None  # the measured quantity (error, p-value, mismatches), where there is one
    limit: float | None = None  # the bound it is held to
    detail: str = ""


@dataclass(frozen=True)
class Figure:
    """Observed vs expected frequencies of one sampled row, its most likely tokens first."""

    title: str
    labels: list[str]
    expected: list[float]
    observed: list[float]
    rest_expected: float
    rest_observed: float
    n: int


@dataclass
class VerifyResult:
    model: str
    plan: str
    dtype: str
    seed: int
    alpha: float
    checks: list[Check] = field(default_factory=list)
    figure: Figure | None = None
    seconds: float = 0.0
    prompts: list[list[int]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def section(self, name: str) -> list[Check]:
        return [c for c in self.checks if c.section == name]

    def sections(self) -> list[str]:
        return list(dict.fromkeys(c.section for c in self.checks))


Advance = Callable[[str], None]


def steps_of(plan: Plan) -> int:
    """Progress units verify() reports: 2 loads, generation, one per prompt, prefill consistency, seeds, norms,
    and one per sampling case."""
    return 6 + plan.prompts + len(plan.grid) + BOUNDARY_CASES


def _engine(model: Path, dtype: str, rows: int) -> Engine:
    return Engine(
        EngineConfig(
            str(model),
            dtype=dtype,
            device="cpu",
            page_size=PAGE_SIZE,
            max_running_req=rows,
            max_seq_len_override=MAX_SEQ_LEN,
            num_page_override=rows * MAX_SEQ_LEN // PAGE_SIZE,
        )
    )


def load_tokenizer(model: Path) -> Any | None:
    """The model dir's tokenizer, or None if it has none (then prompts are random token ids)."""
    if not ((model / "tokenizer.json").is_file() or (model / "tokenizer_config.json").is_file()):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def make_prompts(tokenizer: Any | None, count: int, vocab: int, seed: int) -> tuple[list[list[int]], list[str]]:
    """Token ids and display labels: the tokenizer's encoding of PROMPTS, or seeded random ids without one."""
    if tokenizer is not None:
        texts = PROMPTS[:count]
        return [list(tokenizer.encode(t)) for t in texts], [repr(t) for t in texts]
    gen = torch.Generator().manual_seed(seed)
    lengths = RANDOM_PROMPT_LENGTHS[:count]
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    return prompts, [f"{n} random ids" for n in lengths]


def token_labeler(tokenizer: Any | None) -> Callable[[int], str]:
    if tokenizer is None:
        return str
    return lambda t: f"{t} {tokenizer.decode([t])!r}"


def check_greedy_and_logits(
    gens: Sequence[Generation],
    prompts: Sequence[list[int]],
    labels: Sequence[str],
    hf: HFOracle,
    dtype: torch.dtype,
    advance: Advance,
) -> list[Check]:
    tol = logit_tolerance(dtype)
    checks = []
    for gen, prompt, label in zip(gens, prompts, labels):
        forced = hf.teacher_forced_logits([*prompt, *gen.output_ids])
        rows = forced[len(prompt) - 1 : len(prompt) - 1 + len(gen.output_ids)]
        failure = check_forced_greedy(gen.output_ids, gen.logits, rows, tol)
        checks.append(
            Check("greedy parity", label, failure is None, detail=failure or f"{len(gen.output_ids)} tokens identical")
        )
        engine_rows = torch.stack(gen.logits)
        err, bound = logits_error(engine_rows, rows), tol.bound(rows)
        checks.append(
            Check(
                "logit error", label, err <= bound, err, bound, f"{len(rows)} positions vs HF float64, rel {tol.rel:g}"
            )
        )
        advance(f"HF float64 on {label}")
    return checks


def check_prefill_consistency(
    engine: Engine, gens: Sequence[Generation], prompts: Sequence[list[int]], labels: Sequence[str]
) -> list[Check]:
    """At each prompt's last step s: the decode row against a fresh prefill of prompt + tokens[:s], and that
    prefill against the same prefix prefilled in two chunks (the prompt, then the s tokens as one extend)."""
    tol = logit_tolerance(engine.dtype)
    prefixes = [[*prompt, *gen.output_ids[:-1]] for prompt, gen in zip(prompts, gens)]
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    single = StaticDriver(engine, PageLayout("interleaved"), record_logits=True).generate(prefixes, params)
    split = StaticDriver(engine, PageLayout("shuffled", 1), record_logits=True)
    uids = [split.add(pre, params, chunk_sizes=[len(p), len(pre) - len(p)]) for pre, p in zip(prefixes, prompts)]
    split.run()
    checks = []
    for gen, one, uid, label in zip(gens, single, uids, labels):
        step = len(gen.output_ids) - 1
        prefilled = one.logits[0]
        err, bound = logits_error(gen.logits[step], prefilled), tol.bound(prefilled)
        checks.append(Check("decode ≡ prefill", f"{label}, step {step}", err <= bound, err, bound))
        err, bound = logits_error(split.result(uid).logits[0], prefilled), tol.bound(prefilled)
        checks.append(Check("split prefill ≡ prefill", f"{label}, extend of {step} tokens", err <= bound, err, bound))
    return checks


def check_seeded(engine: Engine, prompts: Sequence[list[int]], labels: Sequence[str], seed: int) -> list[Check]:
    """Seeded requests give the same tokens whatever the engine generator's state and the batch order."""
    two = list(prompts[:2])
    params = [SamplingParams(temperature=1.5, seed=seed * 1000 + i + 1, max_tokens=6, ignore_eos=True) for i in (0, 1)]
    engine.sampler.generator.manual_seed(seed)
    first = StaticDriver(engine).generate(two, params)
    engine.sampler.generator.manual_seed(seed + 1)
    second = StaticDriver(engine, PageLayout("shuffled", seed)).generate(two[::-1], params[::-1])[::-1]
    return [
        Check(
            "seeded sampling",
            f"{label}, seed {p.seed}",
            a.output_ids == b.output_ids,
            detail=f"run 1 {a.output_ids}, run 2 (other generator state, batch reversed) {b.output_ids}",
        )
        for a, b, p, label in zip(first, second, params, labels)
    ]


def check_bf16_norms(model: Path, seed: int) -> list[Check]:
    """Every RMSNorm of a bf16 engine against the HF module of the same name, bitwise, on shared bf16 inputs."""
    engine = _engine(model, "bfloat16", rows=1)
    try:
        hf_model = HFOracle(model, dtype=torch.bfloat16).model
        gen = torch.Generator().manual_seed(seed)
        mismatched, compared, modules, missing = 0, 0, 0, []
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
                    x = (torch.randn(8, module.weight.numel(), generator=gen) * scale).to(torch.bfloat16)
                    ours, theirs = module(x), reference(x)
                    mismatched += int((ours != theirs).sum())
                    compared += ours.numel()
    finally:
        engine.shutdown()
    section, what = "bf16 norms", "RMSNorm modules, bitwise vs HF in bf16"
    if missing:
        return [Check(section, what, False, detail=f"HF has no module named {missing}")]
    if modules == 0:
        return [Check(section, what, False, detail="the engine model has no RMSNorm module")]
    detail = f"{modules} modules x {len(NORM_SCALES)} input scales: {mismatched} of {compared} outputs differ"
    return [Check(section, what, mismatched == 0, float(mismatched), 0.0, detail)]


def detectable_w(n: int, df: int, alpha: float, target: float = 0.9) -> float:
    """Smallest Cohen's w the chi-square test detects with `target` power (bisection on oracle.stats.power)."""
    if df < 1 or n < 1:
        return math.inf
    lo, hi = 0.0, 1.0
    while power(n, hi, df, alpha) < target:
        hi *= 2
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if power(n, mid, df, alpha) < target else (lo, mid)
    return hi


def draw(engine: Engine, row: torch.Tensor, params: SamplingParams, n: int, seed: int) -> tuple[torch.Tensor, int, int]:
    """The engine's sampler on `row` in mixed batches until n sampled draws: (counts, greedy rows, greedy argmax)."""
    vocab = row.numel()
    rows = CHUNK_ROWS
    greedy = torch.tensor([i % GREEDY_EVERY == GREEDY_EVERY - 1 for i in range(rows)])
    reqs = [
        Req(torch.zeros(1, dtype=torch.int32), i, 0, 1, i, SamplingParams() if g else params)
        for i, g in enumerate(greedy.tolist())
    ]
    sampler = engine.sampler
    sampler.generator.manual_seed(seed)
    args = sampler.prepare(Batch(reqs, "decode"))
    logits = row.to(engine.device.torch_device, torch.float32).expand(rows, vocab).contiguous()
    argmax = int(row.argmax())
    counts = torch.zeros(vocab, dtype=torch.int64)
    drawn = greedy_rows = greedy_ok = 0
    while drawn < n:
        tokens = sampler.sample(logits, args).cpu().long()
        sampled = tokens[~greedy][: n - drawn]
        counts += torch.bincount(sampled, minlength=vocab)
        drawn += len(sampled)
        greedy_rows += int(greedy.sum())
        greedy_ok += int((tokens[greedy] == argmax).sum())
    return counts, greedy_rows, greedy_ok


def describe(params: SamplingParams) -> str:
    parts = [f"T={params.temperature:g}"]
    if params.top_k != -1:
        parts.append(f"top_k={params.top_k}")
    if params.top_p < 1.0:
        parts.append(f"top_p={params.top_p:g}")
    if params.min_p > 0.0:
        parts.append(f"min_p={params.min_p:g}")
    return " ".join(parts)


@dataclass(frozen=True)
class SamplingCase:
    params: SamplingParams
    row: int  # index into the rows (one per prompt)
    why: str


BOUNDARY_CASES = 2


def boundary_cases(rows: Sequence[torch.Tensor]) -> list[SamplingCase]:
    """Two points placed where filter semantics differ, on the row whose 2nd token is most likely (T = 1).

    With q1 >= q2 the two largest probabilities:
    * top_p = q1 + q2/2: the 2nd token crosses p, and HF keeps it (the mass above it, q1, is < p);
    * top_k = 2, top_p midway between q1 and q1/(q1+q2): HF applies top-k, renormalizes (the top token now has
      q1/(q1+q2) > p) and keeps one token; top-p on the full distribution would keep two.
    """
    tops = [torch.softmax(r.double(), -1).topk(2).values for r in rows]
    best = max(range(len(rows)), key=lambda i: float(tops[i][1]))
    q1, q2 = (float(v) for v in tops[best])
    return [
        SamplingCase(_sp(1.0, top_p=min(1.0, q1 + q2 / 2)), best, "p inside the 2nd token's mass"),
        SamplingCase(_sp(1.0, top_k=2, top_p=(q1 + q1 / (q1 + q2)) / 2), best, "order of top-k and top-p"),
    ]


def check_sampling(
    engine: Engine,
    rows: Sequence[torch.Tensor],
    row_labels: Sequence[str],
    cases: Sequence[SamplingCase],
    alpha: float,
    seed: int,
    token_label: Callable[[int], str],
    advance: Advance,
    samples: int,
) -> tuple[list[Check], Figure | None]:
    checks: list[Check] = []
    figure, plotted_df = None, -1
    for i, case in enumerate(cases):
        row, params = rows[case.row], case.params
        name = f"{describe(params)} on {row_labels[case.row]}" + (f" ({case.why})" if case.why else "")
        counts, greedy_rows, greedy_ok = draw(engine, row, params, samples, seed + i)
        ref = reference_distribution(row, params)
        chi = chi_square_gof(counts, ref.probs, alpha, exclude=ref.ambiguous)
        support = support_check(counts, ref.probs, int(counts.sum()), alpha, ref.ambiguous)
        w = detectable_w(chi.n, chi.df, alpha)
        power_note = f"; detects w >= {w:.3g} with 90% power" if chi.df else ""
        checks.append(
            Check("sampling", f"chi-square: {name}", chi.passed, chi.p_value, alpha, chi.message() + power_note)
        )
        checks.append(
            Check("sampling", f"support: {name}", support.passed, float(len(support.outside)), 0.0, support.message())
        )
        checks.append(
            Check(
                "sampling",
                f"greedy rows: {name}",
                greedy_ok == greedy_rows,
                float(greedy_rows - greedy_ok),
                0.0,
                f"{greedy_ok}/{greedy_rows} greedy rows in the mixed batches returned the argmax",
            )
        )
        if chi.df > plotted_df:  # plot the most informative case: the most chi-square bins
            figure, plotted_df = _figure(name, counts, ref.probs, token_label), chi.df
        advance(f"sampling {name}")
    return checks, figure


def _figure(name: str, counts: torch.Tensor, probs: torch.Tensor, token_label: Callable[[int], str]) -> Figure:
    n = int(counts.sum())
    top = torch.argsort(probs, descending=True, stable=True)[:20]
    top = top[probs[top] > 0]
    expected = probs[top].tolist()
    observed = (counts[top].double() / n).tolist()
    return Figure(
        f"{name}: observed vs expected (n={n})",
        [token_label(int(t)) for t in top],
        expected,
        observed,
        max(0.0, 1.0 - sum(expected)),
        max(0.0, 1.0 - sum(observed)),
        n,
    )


def verify(model: str | Path, quick: bool = False, seed: int = 0, advance: Advance | None = None) -> VerifyResult:
    """Run every section on `model`; raises EngineError / OSError on a bad model dir."""
    step: Advance = advance or (lambda _: None)
    start = time.perf_counter()
    model = Path(model)
    plan = QUICK if quick else FULL
    engine = _engine(model, "auto", rows=plan.prompts)
    try:
        step("engine loaded")
        tokenizer = load_tokenizer(model)
        prompts, labels = make_prompts(tokenizer, plan.prompts, engine.model_config.vocab_size, seed)
        hf = HFOracle(model, dtype=torch.float64)
        hf.model  # noqa: B018 - load now, so the progress step measures it
        step("HF float64 loaded")
        gens = StaticDriver(engine, PageLayout("shuffled", seed), record_logits=True).generate(
            prompts, SamplingParams(temperature=0.0, max_tokens=plan.max_tokens, ignore_eos=True)
        )
        step("engine greedy generation")
        checks = check_greedy_and_logits(gens, prompts, labels, hf, engine.dtype, step)
        checks += check_prefill_consistency(engine, gens, prompts, labels)
        step("decode and split prefill vs prefill")
        checks += check_seeded(engine, prompts, labels, seed)
        step("seeded sampling")
        checks += check_bf16_norms(model, seed)
        step("bf16 norms")
        rows = [g.logits[0] for g in gens]
        # Fixed grid points go to the most uncertain rows first: a near one-hot row tests little.
        entropy = [float(torch.special.entr(torch.softmax(r.double(), -1)).sum()) for r in rows]
        ranked = sorted(range(len(rows)), key=lambda i: -entropy[i])
        cases = boundary_cases(rows) + [SamplingCase(p, ranked[i % len(rows)], "") for i, p in enumerate(plan.grid)]
        alpha = AlphaBudget(tests=2 * len(cases), total=FAMILY_ALPHA).per_test
        sampling, figure = check_sampling(
            engine, rows, labels, cases, alpha, seed, token_labeler(tokenizer), step, plan.samples
        )
        dtype = str(engine.dtype).removeprefix("torch.")
        result = VerifyResult(str(model), plan.name, dtype, seed, alpha, checks + sampling, figure, prompts=prompts)
    finally:
        engine.shutdown()
    result.seconds = time.perf_counter() - start
    return result
