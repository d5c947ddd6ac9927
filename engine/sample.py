"""The sampler: greedy, top-k, top-p, min-p with per-request parameters, in HF's order.

Order and tie rules follow HF's logits processors: temperature → top-k (every token tied with the k-th
value is kept) → top-p on the renormalized result (a token is kept iff the mass strictly above it is < p;
the top token always stays) → min-p (drop tokens with prob < min_p × max prob). Greedy rows take argmax of
the raw logits, so a mixed batch never perturbs them.

Drawing uses the exponential-race trick: argmax(p / E) with E ~ Exp(1) picks token i with probability p_i.
A request with a seed draws its noise from its own generator, seeded by (seed, position), so its tokens
do not depend on the batch it is in.

Rows with nothing to sample (NaN or +inf logits, every logit -inf, or logits / temperature past float32) raise
NonFiniteLogitsError naming them, before any noise is drawn: the engine's generator is untouched, so the other
rows, run again without the bad ones, get the same tokens as before. No row ever gets a made-up token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .core import Batch, Req
from .errors import InvalidRequestError, NonFiniteLogitsError

_SEED_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads (seed, position) pairs over the seed space


@dataclass
class BatchSamplingArgs:
    all_greedy: bool
    greedy: torch.Tensor  # bool [bs]
    temperature: torch.Tensor  # float32 [bs]; 1.0 on greedy rows, never read there
    top_k: torch.Tensor | None  # int64 [bs], vocab on rows without top-k; None when no row uses it
    top_p: torch.Tensor | None  # float32 [bs]
    min_p: torch.Tensor | None  # float32 [bs]
    row_seeds: list[int | None]  # per-row generator seed for this step, None = engine generator
    uids: list[int] = field(default_factory=list)  # the rows' request uids, for error messages


def step_seed(seed: int, position: int) -> int:
    return (seed * _SEED_MIX + position) % (2**63)


class Sampler:
    def __init__(self, device: torch.device, vocab_size: int, seed: int | None = None) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        reqs: list[Req] = batch.reqs
        params = [r.sampling_params for r in reqs]
        greedy = [p.is_greedy for p in params]
        all_greedy = all(greedy)

        def to_dev(values: list[float] | list[int], dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        use_k = any(p.top_k != -1 for p, g in zip(params, greedy) if not g)
        use_p = any(p.top_p < 1.0 for p, g in zip(params, greedy) if not g)
        use_min_p = any(p.min_p > 0.0 for p, g in zip(params, greedy) if not g)
        return BatchSamplingArgs(
            all_greedy=all_greedy,
            greedy=to_dev(greedy, torch.bool),
            temperature=to_dev([1.0 if g else p.temperature for p, g in zip(params, greedy)], torch.float32),
            top_k=to_dev(
                [min(p.top_k, self.vocab_size) if p.top_k > 0 else self.vocab_size for p in params],
                torch.int64,
            )
            if use_k
            else None,
            top_p=to_dev([p.top_p for p in params], torch.float32) if use_p else None,
            min_p=to_dev([p.min_p for p in params], torch.float32) if use_min_p else None,
            row_seeds=[
                None if p.seed is None else step_seed(p.seed, r.device_len) for p, r in zip(params, reqs)
            ],
            uids=[r.uid for r in reqs],
        )

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: float32 [bs, vocab] → int32 token ids [bs]. Raises NonFiniteLogitsError (see the module doc)."""
        bs = len(args.row_seeds)
        if logits.dim() != 2 or logits.shape[0] != bs or logits.shape[1] != self.vocab_size:
            raise InvalidRequestError(
                f"logits have shape {tuple(logits.shape)}, expected [batch size {bs}, vocab {self.vocab_size}]"
            )
        # amax propagates NaN, so this flags NaN, +inf and all -inf rows in one reduction.
        bad = ~logits.amax(dim=-1).isfinite()
        argmax = logits.argmax(dim=-1)
        if args.all_greedy:
            self._check_rows(bad, args, logits)
            return argmax.to(torch.int32)
        probs = self.filtered_probs(logits, args)
        self._check_rows(bad | (probs.isnan().any(dim=-1) & ~args.greedy), args, logits)
        sampled = (probs / self._exponential_noise(probs, args.row_seeds)).argmax(dim=-1)
        return torch.where(args.greedy, argmax, sampled).to(torch.int32)

    @staticmethod
    def _check_rows(bad: torch.Tensor, args: BatchSamplingArgs, logits: torch.Tensor) -> None:
        """One host sync per step; the message is built only on the error path."""
        if not bool(bad.any()):
            return
        rows = bad.nonzero().flatten().tolist()
        uids = [args.uids[r] for r in rows] if args.uids else rows
        row = logits[rows[0]]
        what = (
            "NaN logits" if bool(row.isnan().any())
            else "+inf logits" if bool(row.isposinf().any())
            else "every logit -inf" if bool(row.isneginf().all())
            else f"logits / temperature={float(args.temperature[rows[0]])} overflowing float32"
        )
        raise NonFiniteLogitsError(
            f"request(s) {uids} (batch rows {rows}) have no token to sample: row {rows[0]} has {what}; the model "
            "produced non-finite values (check its weights and dtype) or the temperature is too small. Abort these "
            "requests; the other rows are unaffected",
            rows,
            uids,
        )

    def filtered_probs(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """The probability vector each sampled row draws from (float32)."""
        logits = logits / args.temperature.unsqueeze(1)
        if args.top_k is not None:
            sorted_logits = logits.sort(dim=-1, descending=True).values
            kth = sorted_logits.gather(1, (args.top_k - 1).unsqueeze(1))
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if args.top_p is not None:
            probs = logits.softmax(dim=-1)
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop_sorted = mass_above >= args.top_p.unsqueeze(1)
            drop_sorted[:, 0] = False
            drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
            logits = logits.masked_fill(drop, float("-inf"))
        if args.min_p is not None:
            probs = logits.softmax(dim=-1)
            threshold = args.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < threshold, float("-inf"))
        return logits.softmax(dim=-1)

    def _exponential_noise(self, probs: torch.Tensor, row_seeds: list[int | None]) -> torch.Tensor:
        noise = torch.empty_like(probs)
        noise.exponential_(generator=self.generator)
        for row, seed in enumerate(row_seeds):
            if seed is not None:
                gen = torch.Generator(device=probs.device).manual_seed(seed)
                noise[row].exponential_(generator=gen)
        # An exact 0 would turn p/0 into inf (or nan for a dropped token); the clamp changes nothing else.
        return noise.clamp_(min=torch.finfo(noise.dtype).tiny)
