"""The Engine: builds everything in a fixed order (Engine.__init__, every check before the first allocation) and runs
one forward pass per call without waiting for the device; a step's errors come back with its host tokens
(ForwardOutput.result), which undoes the step first. A decode batch of a captured size is one graph replay.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from .attention import ATTENTION_BACKENDS, create_backend
from .checks import checked_seed
from .config import EngineConfig
from .core import Batch, Context, Phase, Req, SamplingParams
from .device import CPU_THREADS, cpu_threads_for, make_device, resolve_device, upload
from .distributed import Comm, NullComm, TorchDistComm
from .distributed.tp import shard_config
from .errors import ConfigError, EngineBusyError, EngineClosedError
from .graph import GraphRunner, Mode, StepOutputs, default_graph_bs
from .kvcache import KVCachePool, model_footprint, plan_num_pages
from .layers.kernels import LAYER_KERNELS, LayerKernels
from .models import ModelConfig, fill_dummy_weights, get_model_class, load_weights
from .moe import MOE_BACKENDS
from .registry import Where
from .sample import SAMPLERS, BatchSamplingArgs, no_draws
from .step.inputs import BatchInputs, pack_inputs, unpack_inputs
from .step.kernels import STEP_KERNELS, StepKernels
from .step.layout import InputLayout
from .step.record import ForwardOutput, StepRecord
from .validate import Limits, check_ends, check_fresh, check_memory, validate_batch


@dataclass(frozen=True)
class _Choices:
    attention: str
    moe: Any
    kernels: LayerKernels
    step: StepKernels
    sampler: str


class Engine:
    def __init__(self, config: EngineConfig, sampler_seed: int | None = None) -> None:
        if sampler_seed is not None:
            sampler_seed = checked_seed(ConfigError, "sampler_seed", sampler_seed)
        self.config = config
        self._closed = False
        self._busy = threading.RLock()  # one thread at a time; the same thread may re-enter
        self._release_threads: Callable[[], object] = lambda: None
        # Page-table row -> (cached tokens, uid) of its last request: no other may write there until release_rows.
        self.live_rows: dict[int, tuple[int, int]] = {}
        self._claim: weakref.ref[object] | None = None
        self._init_tp()
        choices = self._init_device()
        self._init_comm()
        free_here = self.device.free_memory()
        free_before = self.comm.min_int(free_here)
        self._load_model(choices, free_before, free_here)
        self._init_kv_cache(free_before)
        self._init_page_table()
        self._init_attention(choices)
        self.sampler = SAMPLERS.factory(choices.sampler)(self.device.torch_device, self.model_config.vocab_size,
                                                          sampler_seed)
        self.sampler.declare_logits_dtype(self.dtype)  # the model's logits are its dtype's values, upcast
        self._init_graphs(choices)
        self._init_cpu_threads()  # last: a constructor that fails earlier leaves the thread count alone

    def _init_tp(self) -> None:
        self.tp_info = self.config.tp_info
        self.local_config = shard_config(self.config.model_config, self.tp_info)

    def _init_device(self) -> _Choices:
        torch_device = resolve_device(self.config.device, self.tp_info.rank)
        self.device = make_device(torch_device)
        self.dtype = self.config.resolve_dtype(torch_device)
        if torch_device.type == "cpu" and self.dtype in (torch.float16,):
            raise ConfigError("dtype=float16 is not supported on CPU; use float32 or bfloat16")
        where = Where(torch_device, self.dtype, self.model_config.head_dim)
        config = self.config
        names = config.invariant_backends(torch_device.type) if config.batch_invariant else (
            config.attention_backend, config.layer_kernels
        )
        attention, kernels = ATTENTION_BACKENDS.resolve(names[0], where), LAYER_KERNELS.resolve(names[1], where)
        return _Choices(
            attention=attention,
            moe=MOE_BACKENDS.factory(MOE_BACKENDS.resolve(config.moe_backend, where))(),
            kernels=LAYER_KERNELS.factory(kernels)(),
            step=STEP_KERNELS.factory(STEP_KERNELS.resolve(config.step_kernels, where))(),
            sampler=SAMPLERS.resolve(config.sampler_backend, where),
        )

    def _init_comm(self) -> None:
        tp, config = self.tp_info, self.config
        self.comm: Comm = (
            NullComm()
            if tp.size == 1
            else TorchDistComm(
                tp.rank, tp.size, config.distributed_port, config.distributed_timeout, self.device.torch_device
            )
        )

    def _load_model(self, choices: _Choices, free_before: int, free_here: int) -> None:
        """Build on the meta device, check it fits (free_before: least free of all ranks), fill it, measure it."""
        config, model_config = self.config, self.model_config
        self.max_seq_len = config.max_seq_len
        with torch.device("meta"):
            model = get_model_class(model_config.architecture)(self.local_config, choices.moe).to(self.dtype)
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self._bytes_per_page = KVCachePool.bytes_per_page(
            model_config.num_layers, config.page_size, self.local_config.num_kv_heads, model_config.head_dim,
            self.dtype,
        )
        needs = {
            "weights": param_bytes,
            "page table": (config.max_running_req + 1) * self.max_seq_len * 4,
            "rotary tables": 4 * self.max_seq_len * model_config.head_dim * 4,  # cos, sin and two temporaries
        }
        if config.num_page_override is not None:
            needs["KV pool"] = (config.num_page_override + 1) * self._bytes_per_page
        check_memory(free_before, needs, "lower num_page_override, max_running_req or max_seq_len_override")
        model = model.to_empty(device=self.device.torch_device)
        if config.use_dummy_weight:
            fill_dummy_weights(model)
        else:
            load_weights(model, config.model_path, model_config.tie_word_embeddings)
        if self.device.is_cuda:
            choices.kernels.arrange_weights(model)
        model.init_rotary(self.max_seq_len, self.device.torch_device)
        self.model = model.eval()
        # On CPU free memory is the whole host's, so the parameter bytes stand.
        measured = free_here - self.device.free_memory() if self.device.is_cuda else None
        self.model_bytes = model_footprint(param_bytes, measured)

    def _init_kv_cache(self, free_before: int) -> None:
        config = self.config
        if config.num_page_override is not None:
            num_pages = config.num_page_override
        else:
            num_pages = plan_num_pages(
                free_before, self.model_bytes, self._bytes_per_page, config.memory_ratio,
                cap_bytes=None if self.device.is_cuda else config.cpu_kv_cache_bytes,
            )
        self.num_pages = self.comm.min_int(num_pages)
        self.limits = Limits(config.max_running_req, self.max_seq_len, self.model_config.vocab_size,
                             self.num_pages * config.page_size, config.page_size)
        self.kv_cache = KVCachePool(
            self.model_config.num_layers, self.num_pages, config.page_size, self.local_config.num_kv_heads,
            self.model_config.head_dim, self.dtype, self.device.torch_device,
        )

    def _init_page_table(self) -> None:
        """Token slots, max_running_req + 1 rows: the last is the dummy row (graph padding), all in the dummy page."""
        config, device = self.config, self.device.torch_device
        self.dummy_row = config.max_running_req
        self.page_table = torch.zeros(config.max_running_req + 1, self.max_seq_len, dtype=torch.int32, device=device)
        dummy_slots = self.kv_cache.dummy_page * config.page_size
        self.page_table[self.dummy_row] = dummy_slots + torch.arange(self.max_seq_len) % config.page_size
        self.dummy_req = Req(torch.zeros(1, dtype=torch.int32), self.dummy_row, 0, 1, -1, SamplingParams())
        # Each row's last sampled token, read when the host has not appended it yet.
        self.last_tokens = torch.zeros(config.max_running_req + 1, dtype=torch.int32, device=device)

    def _init_attention(self, choices: _Choices) -> None:
        self.attn_backend = create_backend(
            choices.attention, self.kv_cache, self.page_table, self.local_config.num_qo_heads,
            self.device.torch_device,
        )
        self.ctx = Context(self.config.page_size, self.page_table, self.kv_cache, self.attn_backend,
                           kernels=choices.kernels, comm=self.comm, batch_invariant=self.config.batch_invariant)
        self.step_kernels = choices.step

    def _init_graphs(self, choices: _Choices) -> None:
        config = self.config
        max_graph_bs = min(config.cuda_graph_max_bs or config.max_running_req, config.max_running_req)
        graph_bs = default_graph_bs(max_graph_bs) if config.cuda_graph_bs is None else config.cuda_graph_bs
        self.graph_runner = GraphRunner(
            self.dummy_req,
            [bs for bs in graph_bs if bs <= config.max_running_req],
            enabled=self.device.is_cuda
            and self.attn_backend.supports_cuda_graph
            and (self.model_config.num_experts == 0 or choices.moe.supports_cuda_graph),
            hand_out=choices.step.hand_out,
        )
        if isinstance(self.device.stream, torch.cuda.Stream):
            modes: tuple[Mode, ...] = ("greedy", "logits", *self.sampler.graph_modes())
            self.graph_runner.capture(
                self._graph_step, lambda bs: pack_inputs([], self.limits, {}, True, pad_to=bs), self.attn_backend,
                self.device.stream, self.max_seq_len, self.device.torch_device, modes,
            )

    def _init_cpu_threads(self) -> None:
        threads = cpu_threads_for(self.tp_info.size) if self.device.torch_device.type == "cpu" else None
        if threads is not None:
            self._release_threads = weakref.finalize(self, CPU_THREADS.release, CPU_THREADS.claim(threads))

    @property
    def model_config(self) -> ModelConfig:
        return self.config.model_config

    def claim(self, token: object | None) -> None:
        """Mark the engine as driven by whoever holds `token` (held weakly); None marks it free."""
        self._claim = weakref.ref(token) if token is not None else None

    @property
    def claimed_by(self) -> object | None:
        return self._claim() if self._claim is not None else None

    def check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this Engine was shut down; build a new Engine")

    @contextmanager
    def exclusive(self, what: str) -> Iterator[None]:
        """Hold the engine for one call; a call from a second thread meanwhile is refused, not interleaved."""
        if not self._busy.acquire(blocking=False):
            raise EngineBusyError(f"{what}: the engine is in use by another thread; an Engine serves one at a time")
        try:
            yield
        finally:
            self._busy.release()

    def release_rows(self, rows: Iterable[int]) -> None:
        """Declare these rows' KV dead: other rows may write their slots again."""
        self.check_open()
        with self.exclusive("release_rows"):
            for row in rows:
                self.live_rows.pop(row, None)

    def prepare_batch(
        self, reqs: Sequence[Req], phase: Phase, ends: Sequence[int] | None = None
    ) -> tuple[Batch, BatchSamplingArgs]:
        """Validate, pad and build the inputs and sampling args (a graph batch: only packed inputs). ends: each
        request's device_len for this pass (None: its own); the requests stay unchanged until forward_batch, and the
        page-table rows must hold slots for [0, end)."""
        self.check_open()
        with self.exclusive("prepare_batch"):
            if ends is None:
                return self._prepare_batch(reqs, phase)
            targets = check_ends(reqs, ends)
            lengths = [r.device_len for r in reqs]
            try:
                for req, end in zip(reqs, targets):
                    req.device_len = end
                batch, args = self._prepare_batch(reqs, phase)
            finally:
                for req, device_len in zip(reqs, lengths):
                    req.device_len = device_len
            batch.spans = [(cached_len, device_len) for (cached_len, _), device_len in zip(batch.spans, lengths)]
            return batch, args

    def _prepare_batch(self, reqs: Sequence[Req], phase: Phase) -> tuple[Batch, BatchSamplingArgs]:
        validate_batch(reqs, phase, self.limits, self.live_rows)
        spans = [(r.cached_len, r.device_len) for r in reqs]
        batch = Batch(list(reqs), phase, spans=spans, ends=[end for _, end in spans])
        self.graph_runner.pad_batch(batch)
        decode = phase == "decode"
        if self.graph_runner.can_use_graph(batch):
            batch.packed_inputs = pack_inputs(reqs, self.limits, self.live_rows, decode, batch.padded_size)
            with self.device.stream_context():
                return batch, self.sampler.prepare(batch)
        host, layout = pack_inputs(reqs, self.limits, self.live_rows, decode)
        self._wait_for_caller()
        with self.device.stream_context():
            self._set_inputs(batch, self._unpack(upload(host, self.device.torch_device), layout))
            self.attn_backend.prepare_metadata(batch)
            return batch, self.sampler.prepare(batch)

    def _unpack(self, packed: torch.Tensor, layout: InputLayout) -> BatchInputs:
        return unpack_inputs(packed, layout, self.page_table, self.last_tokens, self.step_kernels, self.limits)

    @staticmethod
    def _set_inputs(batch: Batch, inputs: BatchInputs) -> None:
        batch.input_ids, batch.positions, batch.out_loc = inputs.ids, inputs.positions, inputs.out_loc
        batch.table_rows, batch.rows, batch.slot_flags = inputs.table_rows, inputs.rows, inputs.flags

    def _wait_for_caller(self) -> None:
        if isinstance(self.device.stream, torch.cuda.Stream):
            self.device.stream.wait_stream(torch.cuda.current_stream(self.device.torch_device))

    def _caller_waits(self) -> None:
        if isinstance(self.device.stream, torch.cuda.Stream):
            torch.cuda.current_stream(self.device.torch_device).wait_stream(self.device.stream)

    def _graph_step(self, packed: torch.Tensor, layout: InputLayout, batch: Batch, mode: Mode) -> StepOutputs:
        """A whole decode step as captured: inputs, metadata, model, and (but in logits mode) the tokens, greedy or
        drawn by the sampler, and the host payload."""
        inputs = self._unpack(packed, layout)
        self._set_inputs(batch, inputs)
        self.attn_backend.graph_metadata(batch)
        with self.ctx.forward_batch(batch):
            logits = self.model(batch.input_ids, batch.positions, self.ctx)
        if mode == "logits":
            return StepOutputs(logits, inputs)
        if mode == "greedy":  # the argmax of the model's dtype is the argmax of its upcast
            tokens, payload = self.step_kernels.greedy_step(logits, self.last_tokens, inputs.rows, inputs.flags)
        else:
            tokens = self.sampler.graph_draw(logits.float(), mode, inputs.device_lens)
            payload = self.step_kernels.keep_tokens(tokens, self.last_tokens, inputs.rows, inputs.flags)
        return StepOutputs(logits, inputs, tokens, payload)

    def _sample_and_keep(
        self, logits: torch.Tensor, args: BatchSamplingArgs, batch: Batch
    ) -> tuple[torch.Tensor, Callable[[], None], torch.Tensor]:
        """A step sampled outside a graph: (tokens, the draws' undo, keep_tokens' payload)."""
        tokens, undo_draws = self.sampler.sample_deferred(logits, args)
        payload = self.step_kernels.keep_tokens(tokens, self.last_tokens, batch.rows[: batch.size], batch.slot_flags)
        return tokens, undo_draws, payload

    def _graph_mode(self, batch: Batch, args: BatchSamplingArgs) -> Mode | None:
        """The captured step this batch replays, or None: it runs eagerly."""
        bs = batch.padded_size
        if batch.packed_inputs is None or not self.graph_runner.has_graph(bs):
            return None
        if args.all_greedy:
            return "greedy"
        mode = args.graph_mode
        return mode if mode is not None and self.graph_runner.has_graph(bs, mode) else "logits"

    def forward_batch(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        self.check_open()
        with self.exclusive("forward_batch"):
            check_fresh(batch, args)
            try:
                for req, end in zip(batch.reqs, batch.ends):
                    req.device_len = end
                return self._forward_batch(batch, args)
            except BaseException:
                for req, (cached_len, device_len) in zip(batch.reqs, batch.spans):
                    if req.cached_len == cached_len:
                        req.device_len = device_len
                raise

    @torch.inference_mode()
    def _forward_batch(self, batch: Batch, args: BatchSamplingArgs) -> ForwardOutput:
        self._wait_for_caller()
        n = batch.size
        with self.device.stream_context():
            mode = self._graph_mode(batch, args)
            if mode is not None:
                undo_draws = no_draws
                if mode not in ("greedy", "logits"):  # the sampler draws inside the graph
                    undo_draws = self.sampler.graph_undo(mode)
                    self.sampler.load_graph_params(args)
                step = self.graph_runner.replay(batch, mode)
                self._set_inputs(batch, step.inputs)
                logits = step.logits[:n]
                if step.tokens is not None and step.payload is not None:
                    next_tokens, payload = step.tokens[:n], step.payload
                else:
                    next_tokens, undo_draws, payload = self._sample_and_keep(logits, args, batch)
            else:
                if batch.packed_inputs is not None:  # packed for a graph this engine lacks: run eagerly
                    host, layout = batch.packed_inputs
                    self._set_inputs(batch, self._unpack(upload(host, self.device.torch_device), layout))
                    self.attn_backend.prepare_metadata(batch)
                with self.ctx.forward_batch(batch):
                    logits = self.model(batch.input_ids, batch.positions, self.ctx)[:n].float()
                next_tokens, undo_draws, payload = self._sample_and_keep(logits, args, batch)
            if self.device.is_cuda:
                host = torch.empty(payload.shape, dtype=payload.dtype, pin_memory=True)
                host.copy_(payload, non_blocking=True)
            else:
                host = payload
            event = self.device.record_event()
            # Advance now; a failed step is undone when its tokens are read.
            live_before = [(req.table_idx, self.live_rows.get(req.table_idx)) for req in batch.reqs]
            for req in batch.reqs:
                req.complete_one()
                self.live_rows[req.table_idx] = (req.cached_len, req.uid)
        self._caller_waits()
        record = StepRecord(batch, args, logits, undo_draws, live_before, self.live_rows, self.last_tokens,
                            self.device, self.sampler.raise_for_rows, self.page_table, self.limits)
        return ForwardOutput(next_tokens, event, logits, host, record)

    def shutdown(self) -> None:
        """Release graphs, communication, memory and the thread count; idempotent; EngineBusyError while in use."""
        with self.exclusive("shutdown"):
            if self._closed:
                return
            self._closed = True
            self.graph_runner.destroy()
            self.comm.destroy()
            self._release_threads()
            del self.model, self.kv_cache, self.page_table, self.attn_backend, self.ctx
        if self.device.is_cuda:
            torch.cuda.empty_cache()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
