"""Sampling: BaseSampler (seeds, greedy rows, non-finite rows, undo of the random streams) and its reference Sampler
(HF's temperature, top-k, top-p, min-p by the exponential race, FlashInfer where it serves); rules in docs/sampling.md.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from . import sample_graph
from .core import Batch, Req, SamplingParams
from .device import flashinfer_installed, host_tensor, upload
from .errors import ConfigError, InvalidRequestError, NonFiniteLogitsError
from .registry import Registry, Requires
from .sample_noise import generator_noise_, seeded_noise_for, seeded_race_for
from .sample_rows import KEYS_EXACT_BELOW, row_passes_for, top_k_filter, top_k_top_p_filter

_PHILOX_STRIDE = 1 << 20  # Philox offset per FlashInfer draw: one number per rejection round
_DRAW_MODES = ("draw", "draw_min_p")  # the graph modes FlashInfer draws in: without min-p, with it


@dataclass
class BatchSamplingArgs:
    """What prepare() hands every hook: one entry per batch row, tensors on the sampler's device."""

    all_greedy: bool
    greedy: torch.Tensor
    temperature: torch.Tensor  # float32 [bs]; 1.0 on greedy rows, never read there
    top_k: torch.Tensor | None  # int64 [bs], vocab on rows without top-k; None when no row uses it
    top_k_max: int  # the largest k below vocab that a sampled row asks for (0 when top_k is None)
    top_p: torch.Tensor | None  # float64 [bs]: the cut 1 - top_p is taken in double and then rounded, as HF does
    min_p: torch.Tensor | None
    row_seeds: list[int | None]  # per-row request seed, None = engine generator
    # per row: the position its token is drawn for (the request's device_len); a seeded row's noise is keyed by both
    row_positions: list[int] = field(default_factory=list)
    uids: list[int] = field(default_factory=list)
    greedy_rows: list[bool] = field(default_factory=list)  # the greedy flags on the host
    graph_mode: str | None = None  # the captured step that draws this batch's tokens (a decode batch of graph size)
    # uint8: the parameter block (engine/sample_graph.py) that graph_mode's captured step loads; the row tensors view it
    graph_params: torch.Tensor | None = None
    keys_exact: bool = True  # every sampled row's temperature under KEYS_EXACT_BELOW: top-p may count 16-bit logits
    # (top_k int32, top_p float32 or sample_graph.TOP_P_OFF): FlashInfer's thresholds as the block holds them, or None
    flashinfer_thresholds: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(frozen=True)
class _Prepared:
    """What prepare() derives from a batch's params alone, kept while the same params objects come back in order."""

    params: tuple[SamplingParams, ...]
    block: torch.Tensor
    rows: sample_graph.Rows
    greedy: list[bool]
    top_k_max: int  # 0: no row filters by top-k
    use_p: bool
    use_min_p: bool
    keys_exact: bool


DrawFn = Callable[[torch.Tensor, "BatchSamplingArgs"], torch.Tensor]


class BaseSampler(ABC):
    """The engine calls prepare(batch), then sample_deferred(logits, args). Hooks: filtered_probs (required), draw,
    noise; a sampler with streams besides self.generator extends reseed and saved_streams (calling super)."""

    use_flashinfer = False  # True where draws decide on float32 probabilities (FlashInfer's): checks skip their ties
    # Graph modes captured without min-p, for batches where no row uses it (min-p costs passes even at 0).
    graph_modes_without_min_p: frozenset[str] = frozenset()

    def __init__(self, device: torch.device, vocab_size: int, seed: int | None = None) -> None:
        self.device = device
        self.vocab_size = vocab_size
        self.generator = torch.Generator(device=device)
        self._graph_params = sample_graph.StaticParams(device, vocab_size)
        self._seeded_noise = seeded_noise_for(device)
        self._seeded_race = seeded_race_for(device)
        self._row_passes = row_passes_for(device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self._greedy_rows: dict[int, sample_graph.Rows] = {}
        self._prepared: dict[int, _Prepared] = {}  # by padded size: a decode batch's params repeat step after step
        self._key_dtype: torch.dtype | None = None  # the 16-bit dtype whose values top-p counts, if any

    def declare_logits_dtype(self, dtype: torch.dtype) -> None:
        """Every logits row will hold values of `dtype` (the engine declares its model's, before capturing graphs):
        a 16-bit one lets top-p filter by counts of those values where the row passes can (docs/sampling.md, keys)."""
        exact = dtype in (torch.bfloat16, torch.float16)
        self._key_dtype = dtype if exact and self._row_passes.probs_by_keys is not None else None

    def reseed(self, seed: int) -> None:
        """Restart every random stream from `seed`."""
        self.generator.manual_seed(seed)

    def saved_streams(self) -> Callable[[], None]:
        """An undo for the draws about to be made: puts every random stream back (no host sync)."""
        state = self.generator.get_state()

        def undo() -> None:
            self.generator.set_state(state)

        return undo

    def prepare(self, batch: Batch) -> BatchSamplingArgs:
        reqs: list[Req] = batch.reqs
        params = [r.sampling_params for r in reqs]
        row_seeds = [p.seed for p in params]
        positions = [r.device_len for r in reqs]
        uids = [r.uid for r in reqs]
        if all(p.is_greedy for p in params):  # the row tensors are never read: share one block of greedy rows
            if len(reqs) not in self._greedy_rows:
                self._greedy_rows[len(reqs)] = sample_graph.unpack(
                    sample_graph.upload_block([], len(reqs), self.vocab_size, self.device))
            rows = self._greedy_rows[len(reqs)]
            return BatchSamplingArgs(True, rows.greedy, rows.temperature, None, 0, None, None, row_seeds, positions,
                                     uids)
        got = self._prepare_params(params, batch.padded_size - batch.size)
        rows = got.rows
        args = BatchSamplingArgs(False, rows.greedy, rows.temperature, rows.top_k if got.top_k_max else None,
                                 got.top_k_max, rows.top_p if got.use_p else None,
                                 rows.min_p if got.use_min_p else None, row_seeds, positions, uids, got.greedy,
                                 keys_exact=got.keys_exact, flashinfer_thresholds=(rows.top_k_int, rows.top_p_cut))
        if batch.packed_inputs is not None:
            args.graph_mode = self._graph_mode(args)
            args.graph_params = got.block if args.graph_mode is not None else None
        return args

    def _prepare_params(self, params: list[SamplingParams], pad: int) -> _Prepared:
        """The parameter block and what the rows use, uploaded once per run of identical params (frozen objects)."""
        kept = self._prepared.get(len(params) + pad)  # equal lengths below make the padding equal too
        if kept is not None and len(kept.params) == len(params) and all(map(operator.is_, kept.params, params)):
            return kept
        # One upload: the row tensors are views of the parameter block a captured draw reads too.
        block = sample_graph.upload_block(params, pad, self.vocab_size, self.device)
        greedy = [p.is_greedy for p in params]
        sampled = [p for p, g in zip(params, greedy) if not g]
        filtering_ks = [p.top_k for p in sampled if 0 < p.top_k < self.vocab_size]
        kept = _Prepared(tuple(params), block, sample_graph.unpack(block, len(params)), greedy,
                         max(filtering_ks, default=0), any(p.top_p < 1.0 for p in sampled),
                         any(p.min_p > 0.0 for p in sampled), all(p.temperature < KEYS_EXACT_BELOW for p in sampled))
        self._prepared[len(params) + pad] = kept
        return kept

    def sample(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """logits: float32 [bs, vocab] → int32 token ids [bs]; NonFiniteLogitsError where a row has none."""
        tokens, undo = self.sample_deferred(logits, args)
        bad = (tokens < 0).nonzero().flatten().tolist()
        if bad:
            undo()
            self.raise_for_rows(bad, args, logits)
        return tokens

    def sample_deferred(self, logits: torch.Tensor, args: BatchSamplingArgs) -> tuple[torch.Tensor, Callable[[], None]]:
        """sample without a host sync: (int32 tokens [bs], undo); a -1 row had nothing to sample: call undo(), then
        raise_for_rows."""
        bs = len(args.row_seeds)
        if logits.dim() != 2 or logits.shape[0] != bs or logits.shape[1] != self.vocab_size:
            raise InvalidRequestError(
                f"logits have shape {tuple(logits.shape)}, expected [batch size {bs}, vocab {self.vocab_size}]"
            )
        if args.all_greedy:
            return greedy_tokens(logits), no_draws
        undo = self.saved_streams()
        return self._tokens(logits, args), undo

    def _tokens(
        self, logits: torch.Tensor, args: BatchSamplingArgs, draw: DrawFn | None = None
    ) -> torch.Tensor:
        """int32 [bs]: argmax on greedy rows, a draw on the others, -1 where a row has nothing to sample."""
        top, argmax = logits.max(dim=-1)  # one pass: max(dim) gives the first index of the max, as argmax does
        finite = (top / args.temperature).abs() < float("inf")  # False on NaN too
        return picked(args.greedy, argmax, (draw or self.draw)(_stand_in(logits, finite), args), finite)

    def graph_modes(self) -> tuple[str, ...]:
        """The modes in which graph_draw runs inside a captured decode step: 'seeded' (every sampled row seeded,
        drawn by filtered_probs and the seeded noise) where that noise needs no host (CPU has no graphs: eager)."""
        return ("seeded",) if self._seeded_noise is not generator_noise_ or self.device.type == "cpu" else ()

    def _graph_mode(self, args: BatchSamplingArgs) -> str | None:
        sampled_seeds = [seed for seed, greedy in zip(args.row_seeds, args.greedy_rows) if not greedy]
        keys_fit = args.keys_exact or self._key_dtype is None  # a captured step filters by keys as declared
        return "seeded" if "seeded" in self.graph_modes() and None not in sampled_seeds and keys_fit else None

    def load_graph_params(self, args: BatchSamplingArgs) -> None:
        """Copy a batch's graph_params into the static buffer its captured step reads (before the replay)."""
        assert args.graph_params is not None
        self._graph_params.load(args.graph_params)

    def graph_undo(self, mode: str) -> Callable[[], None]:
        """The undo of the draws a captured step makes in `mode` (taken before its replay): a 'seeded' one draws only
        keyed noise; any other mode saves every stream."""
        return no_draws if mode == "seeded" else self.saved_streams()

    def graph_draw(self, logits: torch.Tensor, mode: str, positions: torch.Tensor) -> torch.Tensor:
        """A sampled batch's tokens inside a captured step, from the parameters load_graph_params loaded; positions:
        int64 [bs], each row's device_len (the seeded noise's key). Every filter is applied (top-k vocab, top-p 1 and
        min-p 0 leave a row as it is), so one step serves any mix; min-p not in graph_modes_without_min_p."""
        rows = sample_graph.unpack(self._graph_params.block(logits.shape[0]))
        min_p = None if mode in self.graph_modes_without_min_p else rows.min_p
        args = BatchSamplingArgs(False, rows.greedy, rows.temperature, rows.top_k, self.vocab_size, rows.top_p,
                                 min_p, [None] * logits.shape[0],
                                 flashinfer_thresholds=(rows.top_k_int, rows.top_p_cut))
        return self._tokens(logits, args, self._graph_draw_fn(mode, rows.seeds, positions))

    def _graph_draw_fn(self, mode: str, seeds: torch.Tensor, positions: torch.Tensor) -> DrawFn | None:
        """How graph_draw draws in `mode`: a draw function, or None for the sampler's own _tokens."""
        if mode != "seeded":
            raise NotImplementedError(f"{type(self).__name__} does not draw in graph mode {mode!r}")
        race = self._seeded_race

        def draw(logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
            return race(self.filtered_probs(logits, args), seeds, positions)

        return draw

    def draws_with_flashinfer(self, args: BatchSamplingArgs) -> bool:
        return False

    def row_distributions(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """float32 [bs, vocab]: what each row of sample() draws from (one-hot argmax on greedy rows)."""
        return with_greedy_rows(logits, args, self.filtered_probs(logits, args))

    @abstractmethod
    def filtered_probs(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """float32 [bs, vocab] probabilities per sampled row, by docs/sampling.md; every logits row has a finite max."""

    def draw(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """int64 [bs] on the device, no host sync: the exponential race argmax(p / noise) over filtered_probs."""
        probs = self.filtered_probs(logits, args)
        return (probs / self.noise(probs, args)).argmax(dim=-1)

    def noise(self, probs: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """Exp(1) noise, never 0, from self.generator; a seeded row draws its own numbers, keyed by its seed and
        position alone (on CUDA from Triton's Philox, as a captured step draws them; elsewhere from a generator of its
        own)."""
        noise = torch.empty_like(probs)
        noise.exponential_(generator=self.generator)
        if any(seed is not None for seed in args.row_seeds):  # a seeded row without its position is an error here
            seeded = [(row, seed, position) for row, (seed, position)
                      in enumerate(zip(args.row_seeds, args.row_positions, strict=True)) if seed is not None]
            keys = upload(host_tensor([value for column in zip(*seeded) for value in column]), self.device).view(3, -1)
            self._seeded_noise(noise, keys[0], keys[1], keys[2])
        return noise.clamp_(min=torch.finfo(noise.dtype).tiny)

    @staticmethod
    def raise_for_rows(rows: list[int], args: BatchSamplingArgs, logits: torch.Tensor) -> None:
        if not rows:
            return
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


class Sampler(BaseSampler):
    """The reference: HF's filters in torch; on CUDA optionally FlashInfer's kernels."""

    graph_modes_without_min_p = frozenset({"draw"})

    def __init__(
        self, device: torch.device, vocab_size: int, seed: int | None = None, use_flashinfer: bool | None = None
    ) -> None:
        """use_flashinfer: None picks it on CUDA when the package is installed; True requires it."""
        super().__init__(device, vocab_size, seed)
        usable = device.type == "cuda" and flashinfer_installed()
        if use_flashinfer and not usable:
            raise ConfigError("FlashInfer sampling needs a CUDA device and the flashinfer package (see docs/gpu.md)")
        self.use_flashinfer = usable if use_flashinfer is None else use_flashinfer
        if self.use_flashinfer:
            import flashinfer.sampling

            self._fi = flashinfer.sampling
            # On the device, so a captured graph draws fresh numbers at each replay.
            self.philox_seed = torch.tensor([self.generator.initial_seed() % 2**63], dtype=torch.int64, device=device)
            self.philox_offset = torch.zeros(1, dtype=torch.int64, device=device)

    def reseed(self, seed: int) -> None:
        super().reseed(seed)
        if self.use_flashinfer:
            self.philox_seed.fill_(self.generator.initial_seed() % 2**63)
            self.philox_offset.zero_()

    def saved_streams(self) -> Callable[[], None]:
        undo_generator = super().saved_streams()
        if not self.use_flashinfer:
            return undo_generator
        offset = self.philox_offset.clone()

        def undo() -> None:
            undo_generator()
            self.philox_offset.copy_(offset)

        return undo

    def draws_with_flashinfer(self, args: BatchSamplingArgs) -> bool:
        return self.use_flashinfer and all(seed is None for seed in args.row_seeds)

    def graph_modes(self) -> tuple[str, ...]:
        """Also 'draw' and 'draw_min_p': an unseeded batch drawn by FlashInfer's kernels, without min-p and with."""
        drawn = _DRAW_MODES if self.use_flashinfer else ()
        return (*drawn, *super().graph_modes())

    def _graph_mode(self, args: BatchSamplingArgs) -> str | None:
        if self.draws_with_flashinfer(args):
            return "draw" if args.min_p is None else "draw_min_p"
        return super()._graph_mode(args)

    def graph_undo(self, mode: str) -> Callable[[], None]:
        """A captured FlashInfer draw moves only the Philox offset, by one stride: its undo moves it back."""
        if mode in _DRAW_MODES and self.use_flashinfer:
            return self._rewind_philox
        return super().graph_undo(mode)

    def _rewind_philox(self) -> None:
        self.philox_offset.sub_(_PHILOX_STRIDE)

    def _graph_draw_fn(self, mode: str, seeds: torch.Tensor, positions: torch.Tensor) -> DrawFn | None:
        if mode in _DRAW_MODES and self.use_flashinfer:
            return None
        return super()._graph_draw_fn(mode, seeds, positions)

    def _tokens(self, logits: torch.Tensor, args: BatchSamplingArgs, draw: DrawFn | None = None) -> torch.Tensor:
        """A FlashInfer draw reads the tempered softmax, whose passes also give the greedy argmax and finite rows."""
        if draw is not None or not self.draws_with_flashinfer(args):
            return super()._tokens(logits, args, draw)
        probs, argmax, finite = self._row_passes.tempered_softmax(logits, args.temperature)
        return picked(args.greedy, argmax, self.flashinfer_draw(probs, args), finite)

    def row_distributions(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        if not self.draws_with_flashinfer(args):
            return super().row_distributions(logits, args)
        probs = self._row_passes.tempered_softmax(logits, args.temperature)[0]
        return with_greedy_rows(logits, args, self.flashinfer_probs(probs, args))

    def _flashinfer_filters(
        self, probs: torch.Tensor, args: BatchSamplingArgs
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """(probs, top_k, top_p) for FlashInfer's kernels; top_k is None where it is applied already: min-p reads the
        distribution after top-k."""
        top_k, top_p = args.flashinfer_thresholds or flashinfer_thresholds(args, probs.shape[0], self.vocab_size)
        if args.min_p is None:
            return probs, top_k, top_p
        probs = self._fi.top_k_renorm_probs(probs, top_k)
        probs, mass = self._row_passes.min_p_renorm(probs, args.min_p, probs.amax(dim=-1))
        return probs, None, top_p / mass

    def flashinfer_draw(self, probs: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        """One token per row of probs, no host sync. Min-p goes before top-p (threshold top_p / kept mass): both keep
        a prefix of the descending order, so this keeps HF's tokens (docs/sampling.md)."""
        probs, top_k, top_p = self._flashinfer_filters(probs, args)
        philox = {"seed": self.philox_seed, "offset": self.philox_offset}
        if top_k is None:  # what top_k_top_p_sampling_from_probs runs after its own top-k renorm
            samples = self._fi.top_p_sampling_from_probs(probs, top_p, **philox)
        else:
            samples = self._fi.top_k_top_p_sampling_from_probs(probs, top_k, top_p, filter_apply_order="top_k_first",
                                                               **philox)
        self.philox_offset.add_(_PHILOX_STRIDE)
        return samples

    def flashinfer_probs(self, probs: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        probs, top_k, top_p = self._flashinfer_filters(probs, args)
        if top_k is not None:
            probs = self._fi.top_k_renorm_probs(probs, top_k)
        off = top_p >= 1.0
        renormed = self._fi.top_p_renorm_probs(probs, top_p.clamp(max=1.0))
        return torch.where(off.unsqueeze(1), probs, renormed)

    def filtered_probs(self, logits: torch.Tensor, args: BatchSamplingArgs) -> torch.Tensor:
        by_keys = self._row_passes.probs_by_keys
        if args.top_p is not None and by_keys is not None and self._key_dtype is not None and args.keys_exact:
            return by_keys(logits, args.temperature, args.top_k, args.top_p, args.min_p, self._key_dtype)
        scores = logits / args.temperature.unsqueeze(1)
        if args.top_p is not None:
            scores = top_k_top_p_filter(scores, args.top_k, args.top_p, self._row_passes)
        elif args.top_k is not None:
            scores = top_k_filter(scores, args.top_k, args.top_k_max)
        if args.min_p is not None:
            scores = self._row_passes.min_p_mask(scores, args.min_p)
        return self._row_passes.softmax(scores)


def flashinfer_thresholds(args: BatchSamplingArgs, bs: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What a parameter block holds as flashinfer_thresholds, made from args' rows (args built without a block)."""
    device = args.greedy.device
    # An int32 tensor, never an int: a scalar top_k selects a radix top-k module with a very long JIT build.
    top_k = (torch.full((bs,), vocab, dtype=torch.int32, device=device) if args.top_k is None
             else args.top_k.to(torch.int32))
    top_p = torch.full((bs,), sample_graph.TOP_P_OFF, device=device)
    if args.top_p is not None:
        top_p = torch.where(args.top_p < 1.0, args.top_p.float(), top_p)
    return top_k, top_p


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """int32 [bs]: each row's first argmax, -1 where amax is not finite; no host sync (captured graphs run it)."""
    bad = ~logits.amax(dim=-1).isfinite()
    return torch.where(bad, -1, logits.argmax(dim=-1)).to(torch.int32)


def picked(greedy: torch.Tensor, argmax: torch.Tensor, sampled: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """int32 [bs]: the argmax on greedy rows, the draw on the others, -1 on rows with nothing to sample."""
    return torch.where(finite, torch.where(greedy, argmax, sampled), -1).to(torch.int32)


def no_draws() -> None:
    """The undo of an all-greedy batch."""


def with_greedy_rows(logits: torch.Tensor, args: BatchSamplingArgs, filtered: torch.Tensor) -> torch.Tensor:
    one_hot = torch.zeros_like(filtered).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(args.greedy.unsqueeze(1), one_hot, filtered)


def _stand_in(logits: torch.Tensor, finite: torch.Tensor) -> torch.Tensor:
    """A row with nothing to sample draws from a one-hot (its token is discarded): no filter or kernel sees NaN."""
    one_hot = torch.full_like(logits[:1], float("-inf"))
    one_hot[:, 0].fill_(0.0)  # a fill, not an item assignment: that would copy from the host and wait
    return torch.where(finite.unsqueeze(1), logits, one_hot)


class SamplerFactory(Protocol):
    """(device, vocab size, engine seed or None) → a BaseSampler."""

    def __call__(self, device: torch.device, vocab_size: int, seed: int | None, /) -> BaseSampler: ...


SAMPLERS: Registry[SamplerFactory] = Registry("sampler_backend", preferred=("flashinfer",))
"""Token samplers by name (EngineConfig.sampler_backend)."""
SAMPLERS.register("torch", lambda device, vocab, seed: Sampler(device, vocab, seed, use_flashinfer=False))
SAMPLERS.register(
    "flashinfer",
    lambda device, vocab, seed: Sampler(device, vocab, seed, use_flashinfer=True),
    Requires(devices=("cuda",), package="flashinfer"),
)
