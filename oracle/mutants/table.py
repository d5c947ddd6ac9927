"""The catalogue's table: every mutant by name, in the order a kill table runs them, with the bug it carries, the
public fixes of that bug class, its patch (:mod:`oracle.mutants.catalogue`) and the device path it needs."""

from __future__ import annotations

from .catalogue import attention, driver, invariance, kernels, kv, model, sampling, step
from .catalogue.base import Mutant

MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "top_p_off_by_one",
            "top-p masks on the inclusive cumulative mass, so the token that crosses p is dropped",
            "ggml-org/llama.cpp#1953, aws-neuron/transformers-neuronx#46, Biohub/esm#360",
            sampling.top_p_off_by_one,
        ),
        Mutant(
            "top_k_after_top_p",
            "top-p runs on the full distribution and top-k after it (HF: top-k, renormalize, then top-p)",
            "vllm-project/vllm#1885 (vLLM applied top-p before top-k)",
            sampling.top_k_after_top_p,
        ),
        Mutant(
            "temperature_after_softmax",
            "temperature divides probabilities after softmax; renormalizing cancels it, so T is ignored",
            "google/gemma.cpp#981 (temperature applied to exp(logits), cancelled by the normalization)",
            sampling.temperature_after_softmax,
        ),
        Mutant(
            "min_p_wrong_max",
            "the min-p threshold scales the max of the raw softmax instead of the tempered distribution",
            "state-spaces/mamba#1010 (min-p threshold from the wrong maximum)",
            sampling.min_p_wrong_max,
        ),
        Mutant(
            "greedy_rows_sampled",
            "in a batch mixing greedy and sampled rows, the greedy mask is lost and greedy rows are sampled",
            "FlashML-org/FreeToken#471, vllm-project/vllm-ascend#16430",
            sampling.greedy_rows_sampled,
        ),
        Mutant(
            "seed_ignored",
            "per-request seeds are dropped: seeded rows draw from the engine-wide generator",
            "per-request generators lost when a batch is built (seeded output depends on the batch)",
            sampling.seed_ignored,
        ),
        Mutant(
            "rope_off_by_one",
            "decode tokens get RoPE position device_len instead of device_len - 1 (prefill positions are right)",
            "position ids taken after the sequence-length increment in decode loops",
            step.rope_off_by_one,
        ),
        Mutant(
            "causal_mask_off_by_one_extend",
            "on an extend (cached_len > 0) the causal diagonal is shifted by one: each new token sees the next",
            "gittensor-ai-lab/sparkinfer#3, pytorch/executorch#21749, onnx/onnx#8068 (mask misaligned on extends)",
            attention.causal_mask_off_by_one_extend,
        ),
        Mutant(
            "decode_kv_len_off_by_one",
            "decode attends over the pre-step KV length, leaving out the new token's own K/V",
            "kv length / seq_lens taken before the step's increment",
            attention.decode_kv_len_off_by_one,
        ),
        Mutant(
            "kv_wrong_slot_paged",
            "with page_size > 1, K/V are written with page and offset strides swapped (wrong slot)",
            "paged-KV slot-mapping bugs that only show with block size > 1",
            kv.kv_wrong_slot_paged,
        ),
        Mutant(
            "dummy_page_overlap",
            "the dummy page is page 0, which the allocator also hands out, so padding rows overwrite live KV",
            "a reserved padding page/slot that the allocator does not skip (CUDA-graph padding writing real KV)",
            kv.dummy_page_overlap,
        ),
        Mutant(
            "rmsnorm_model_dtype",
            "RMSNorm's mean of squares and rsqrt run in the model dtype (bf16) instead of fp32",
            "sgl-project/sglang#27540, meta-llama/llama#1048, NVIDIA/TransformerEngine#1132",
            model.rmsnorm_model_dtype,
        ),
        # ---- batch composition, chunked prefill and batched decode (issue #11) ----
        Mutant(
            "extend_positions_restart",
            "a prefill chunk after the first (an extend) gets RoPE positions from 0 instead of from cached_len",
            "huggingface/transformers#43082 (chunked prefill position_ids miss the cached positions), "
            "nntrainer/nntrainer#3808 (prefill with from != 0 uses offset 0)",
            step.extend_positions_restart,
        ),
        Mutant(
            "batch_rows_sorted_by_length",
            "a prefill batch is sorted longest first and its tokens and logits return in that order, so the "
            "requests of a mixed-length batch get each other's rows",
            "vllm-project/vllm#394 (outputs in another order than the inputs), vllm-project/vllm#14645 (batch "
            "order inferred from another structure: tokens leaked between requests)",
            step.batch_rows_sorted_by_length,
        ),
        Mutant(
            "decode_keys_unmasked",
            "batched decode pads keys to the longest request without a key mask: shorter requests attend to padding",
            "OpenNMT/OpenNMT-py#2532 (padding mask applied only at the first decoding step), turboderp/exllama#101 "
            "(batches of unequal prompts attended to padding), sgl-project/sglang-jax#1297 (decode mask misaligned)",
            attention.decode_keys_unmasked,
        ),
        Mutant(
            "pad_slot_zero",
            "the dummy rows padding a decode batch write their K/V to slot 0, a real request's, not the dummy page",
            "vllm-project/vllm#43810 (CUDA-graph padding's slot id wrote into a live KV slot), "
            "sgl-project/sglang#32477 (padding rows' KV writes aimed at slot 0)",
            step.pad_slot_zero,
        ),
        Mutant(
            "last_token_gather_off_by_one",
            "the logits row of each request is gathered at its query end instead of its last token: in a batch of "
            "several, every request but the last gets the next request's first-token logits",
            "abetlen/llama-cpp-python#1179 (sample index off by one: logits read from the wrong row), "
            "PaddlePaddle/FastDeploy#5903 (last-token index into a mixed batch's outputs computed wrongly)",
            attention.last_token_gather_off_by_one,
        ),
        # ---- laws (issue #11 classes 2, 4, 5, 7): each killed by the property stating its law ----------------------
        Mutant(
            "seed_position_lost",
            "the step seed ignores the position: a seeded request draws the same noise at every step",
            "vllm-project/vllm-metal#50 (seeded RNG re-seeded every step, freezing the noise), trymirai/uzu#45 (all "
            "tokens sampled with the same seed)",
            sampling.seed_position_lost,
        ),
        Mutant(
            "pages_mapped_before_table_write",
            "a request's new pages are taken and appended before the page table is written, so an interrupt between "
            "the two leaves it holding pages its row does not map, and every later step of it fails",
            "Bcfg2/bcfg2#222 (a KeyboardInterrupt mid-operation left the server stuck), ooni/probe-legacy#26 (a "
            "scheduler that is not exception-safe keeps what it took)",
            driver.pages_mapped_before_table_write,
        ),
        Mutant(
            "pages_leak_on_abort",
            "an aborted request returns its mapped pages but never the unmapped rest of its reservation",
            "vllm-project/vllm#46283, sgl-project/sglang#21652 (KV blocks of aborted requests never freed)",
            driver.pages_leak_on_abort,
        ),
        Mutant(
            "pages_leak_on_eos",
            "a request that stops on EOS keeps its last page off the free list",
            "kekzl/imp#1115 (one KV block per request never returned), sgl-project/sglang-jax#982 (finish path "
            "frees the wrong KV slots)",
            driver.pages_leak_on_eos,
        ),
        Mutant(
            "kv_write_spills_single_token",
            "a one-token batch (a lone decode, a 1-token prefill chunk) also writes its K/V into the slot one page "
            "further on, which another request may own",
            "gittensor-ai-lab/sparkinfer#289 (a decode KV write through the wrong block table cross-contaminates "
            "other sequences' KV)",
            kv.kv_write_spills_single_token,
        ),
        Mutant(
            "logits_alias_buffer",
            "forward_batch returns its logits as a view of one persistent buffer, overwritten by every later step",
            "wejoncy/sfllm#44 (one logits buffer reused across steps), NVIDIA/TensorRT-LLM#14326 (outputs backed by "
            "storage the next call overwrites)",
            step.logits_alias_buffer,
        ),
        Mutant(
            "graph_logits_alias",
            "a CUDA-graph replay returns the graph's static output buffer, not a copy: the next replay overwrites the "
            "logits of this step",
            "sgl-project/sglang#35546 (outputs cloned out of the captured graph buffer so later replays cannot "
            "overwrite them), vllm-project/vllm#9724 (cudagraph outputs live in the graph pool)",
            step.graph_logits_alias,
            device="cuda",
            needs=(("graphs", True),),
        ),
        # ---- sampler: ties and filter order (issue #11, classes 1, 3 and 6, and HF's tie rules) ----
        Mutant(
            "min_p_before_top_p",
            "min-p runs before top-p, so top-p cuts a distribution renormalized over min-p's survivors (HF: after)",
            "issue #11 class 1: no property drew logits where the two orders differ (HF applies min-p last, "
            "generation/utils.py _get_logits_processor)",
            sampling.min_p_before_top_p,
        ),
        Mutant(
            "top_p_off_rows_truncated",
            "rows without top-p in a batch where others use it get the cut at p = 1: tail tokens whose float32 "
            "mass above reaches 1.0 are dropped",
            "issue #11 class 3: this engine's fp32 cumulative-mass bug, whose guard no test could see (the lost "
            "tokens carry too little mass for chi-square)",
            sampling.top_p_off_rows_truncated,
        ),
        Mutant(
            "top_p_ties_lowest_index",
            "of exact ties that the top-p cut splits, the lowest indices stay (HF's ascending sort keeps the highest)",
            "issue #11: this engine and its oracle until then (a descending stable sort)",
            sampling.top_p_ties_lowest_index,
        ),
        Mutant(
            "top_k_one_is_greedy",
            "top_k = 1 is treated as greedy (argmax), where HF keeps every tied maximum and samples among them",
            "issue #11: this engine until then (SamplingParams.is_greedy was temperature == 0 or top_k == 1)",
            sampling.top_k_one_is_greedy,
        ),
        Mutant(
            "top_k_drops_ties",
            "top-k keeps exactly k tokens (the first k of a sort), dropping tokens tied with the k-th value beyond k",
            "top-k through topk(k).indices, as index-based implementations do; HF keeps every tie with the k-th",
            sampling.top_k_drops_ties,
        ),
        Mutant(
            "flashinfer_joint_order",
            "FlashInfer draws with filter_apply_order=\"joint\" (top-k and top-p on the original distribution) "
            "instead of top_k_first (HF: top-p on the distribution renormalized after top-k)",
            "issue #11 class 6; vllm-project/vllm#1885 (top-p before top-k) is the same bug class on the torch path",
            sampling.flashinfer_joint_order,
            device="cuda",
            needs=(("sampler", "flashinfer"),),
        ),
        Mutant(
            "param_block_stale",
            "the sampler's parameter-block cache is keyed by batch size alone: a batch whose params changed since the "
            "last one of its size samples with the old temperature, filters and seeds",
            "issue #26 (the block uploaded once per run of params); UKGovernmentBEIS/inspect_ai#2580 and "
            "Continuum-AI-Corp/OrcaRouter-Lite#84 (caches keyed without the sampling params served stale results)",
            sampling.param_block_stale,
        ),
        Mutant(
            "graph_params_unloaded",
            "a sampled batch drawn inside a captured step never loads its parameters: the step draws with the static "
            "buffer's previous ones (at first: greedy for every row)",
            "issue #26 (sampling moved into the CUDA graph); the stale-static-input class of graph_positions_stale "
            "(a captured graph reads only what is copied into its buffers before the replay)",
            sampling.graph_params_unloaded,
            device="cuda",
            needs=(("graphs", True),),
        ),
        Mutant(
            "seeded_noise_by_row",
            "a seeded row's noise is keyed by its place in the batch rather than by its seed, so its tokens change "
            "with its batch",
            "FlashInfer's Philox streams are per row of the batch (why seeded rows never draw there); "
            "vllm-project/vllm#51226 (a seeded request's tokens depended on its batch-mates)",
            sampling.seeded_noise_by_row,
            device="cuda",
        ),
        Mutant(
            "top_p_chunk_carry_dropped",
            "the CUDA row pass that counts top-p's removed tokens restarts each 4096-token chunk's cumulative mass "
            "at 0: a seeded row whose cut lies past its first chunk keeps too few tokens",
            "ROCm/aiter#2035 (a top-p kernel's block prefix scan was wrong across blocks), "
            "flashinfer-ai/flashinfer#225 and #226 (prefix sums in the sampling kernels)",
            sampling.top_p_chunk_carry_dropped,
            device="cuda",
        ),
        Mutant(
            "top_p_keys_from_rounded_scores",
            "the CUDA key-count filter bins the tempered scores rounded to the model's dtype, not its logits: "
            "distinct logits whose scores round alike share a bin, and a cut among them keeps the wrong ones",
            "sgl-project/sglang#773 (sampling moved from float16 to float32 logits), PaddlePaddle/PaddleNLP#7337 "
            "(top-p sorted bf16 probabilities), embeddings-benchmark/mteb#4934 (bf16 scores collapsed into ties)",
            sampling.top_p_keys_from_rounded_scores,
            device="cuda",
        ),
        Mutant(
            "key_counts_signed_zeros_apart",
            "the CUDA key-count filter bins -0.0 apart from +0.0, below it: a top-p or top-k cut through a run of "
            "zero scores removes the negative zeros first, where HF's stable sort ties them and removes by index",
            "NVIDIA/cub#218 (radix sort digits made -0.0 and +0.0 tie, in stable order), JakubValtar/radsort#5 (a "
            "radix sort ordered -0.0 before 0.0), JuliaStats/StatsBase.jl#831 (radix and dict counts split zeros)",
            sampling.key_counts_signed_zeros_apart,
            device="cuda",
        ),
        Mutant(
            "tempered_argmax_last_tie",
            "the CUDA row pass that gives a FlashInfer-drawn batch its tempered softmax and greedy argmax takes the "
            "last of a row's tied maxima: a greedy row beside sampled ones no longer gets HF's first argmax",
            "pytorch/pytorch#93630 (a Triton argmax reduction returned the last of tied maxima, not the first); "
            "pytorch/pytorch#10370 (argmax on CUDA gave another tie than on CPU)",
            sampling.tempered_argmax_last_tie,
            device="cuda",
            needs=(("sampler", "flashinfer"),),
        ),
        # ---- GPU path: FlashInfer's paged-KV index and graph replay inputs ----
        Mutant(
            "flashinfer_last_page_len_modulo",
            "FlashInfer's kv_last_page_len is kv_len % page_size: a last page filled exactly counts as empty, so the "
            "request attends to one page fewer (every token's own page at page_size 1)",
            "the paged-KV last-page-length off-by-one of FlashInfer integrations (flashinfer-ai/flashinfer's "
            "paged_kv_last_page_len must be in [1, page_size])",
            attention.flashinfer_last_page_len_modulo,
            device="cuda",
            needs=(("attention", "flashinfer"),),
        ),
        Mutant(
            "graph_positions_stale",
            "a CUDA-graph replay copies the step's packed inputs into the graph's static buffer except their "
            "positions: every replayed decode step uses the positions the buffer held before",
            "static graph inputs not refreshed before replay (vllm-project/vllm's and sglang's graph runners copy "
            "every input into the captured buffers; a missed one replays stale values)",
            step.graph_positions_stale,
            device="cuda",
            needs=(("graphs", True),),
        ),
        Mutant(
            "triton_decode_lengths_frozen",
            "the Triton decode backend's lengths are fixed when the graph is captured (its dummy requests' one "
            "token) instead of computed from each replay's positions: every replayed decode step attends to its "
            "first token only (bites targets with attention=triton and graphs on)",
            "device-side attention metadata left out of the graph's inputs (sglang's and vllm's graph runners "
            "refresh block tables and sequence lengths in place before each replay)",
            attention.triton_decode_lengths_frozen,
            device="cuda",
            needs=(("attention", "triton"), ("graphs", True)),
        ),
        Mutant(
            "triton_new_tokens_rotated_one_ahead",
            "the Triton decode that norms, rotates and stores a step's new tokens itself reads the RoPE tables one "
            "row late: q and the stored k are rotated to the next position (bites targets with attention=triton "
            "and kernels=triton, in decode steps of one padded row)",
            "fused rotary + KV-cache kernels indexing the wrong position or dropping a write (ColossalAI's decoding "
            "fused rotary kernel, reported in Deep-Learning-Profiling-Tools/triton-viz#147; sgl-project/sglang#19636 "
            "restored a fused RoPE + KV-store writeback)",
            attention.triton_new_tokens_rotated_one_ahead,
            device="cuda",
            needs=(("attention", "triton"), ("kernels", "triton")),
        ),
        Mutant(
            "gemv_gate_unactivated",
            "the small-batch GEMV's gated form (down_proj of decode steps of up to 8 rows) multiplies by up alone, "
            "skipping SiLU(gate); larger batches, on cuBLAS, are right (bites targets with kernels=triton)",
            "fused activation-in-GEMM epilogue/prologue bugs (vllm-project/vllm and sgl-project/sglang fixed fused "
            "SiLU-and-mul kernels that dropped or misapplied the gate)",
            model.gemv_gate_unactivated,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        # ---- bad input: the live-row guard, atomic generate, one driver per engine (issue #12) ----
        Mutant(
            "live_rows_unchecked",
            "the slot checks ignore the live page-table rows outside the batch: a hand-built batch whose new token "
            "is mapped to a slot of a running request not in the batch overwrites that request's cached KV",
            "gittensor-ai-lab/sparkinfer#185 (stale block-table entries of a reused row read and wrote other "
            "sequences' KV blocks; fixed by clearing rows on free), vllm-project/vllm#37076 (a KV block handed to "
            "one request while another's KV still lives there)",
            step.live_rows_unchecked,
        ),
        Mutant(
            "generate_admits_eagerly",
            "generate() admits each prompt as soon as it is checked: a bad prompt later in the list leaves the "
            "earlier ones admitted (rows, pages, uids taken) when the error propagates",
            "vllm-project/vllm#26081, vllm-project/vllm#27420 (LLM.chat/generate enqueued the valid requests of a "
            "batch before a later one failed validation; the orphans ran in the next call)",
            driver.generate_admits_eagerly,
        ),
        Mutant(
            "second_driver_allowed",
            "a second StaticDriver on an engine never checks the owner: it is built while the first has running "
            "requests, and both hand out the same page-table rows and KV pages",
            "two schedulers over one KV pool: no public fix of this exact check found; vllm-project/vllm#9198 "
            "(maintainers: two LLM instances on one device are unsupported, nothing refused them)",
            driver.second_driver_allowed,
        ),
        # ---- the overlapped driver (issue #13) ----
        Mutant(
            "overrun_token_kept",
            "a request that hits EOS while the next pass is already in flight keeps that pass's token: its output "
            "runs one token past the EOS",
            "sgl-project/sglang-omni#1607 (with async decode a request finishing at step N is already inside the "
            "launched step N+1, the lookahead overrun, whose row must be dropped), vllm-project/vllm#45357 (step "
            "N+1 in flight still writes a finished request's KV blocks)",
            driver.overrun_token_kept,
        ),
        Mutant(
            "failed_pass_successor_kept",
            "when a pass fails (a row with nothing to sample) while the next one is in flight, that next pass is "
            "not undone: it lands on requests and random streams that were put back underneath it",
            "vllm-project/vllm#19330 (KV load failure recovery: requests rolled back to the last valid state with "
            "the discarded outputs realigned; the generator rollback left for later)",
            driver.failed_pass_successor_kept,
        ),
        # ---- kernels at their boundaries, each killed by an op-level property (issue #22) ----
        Mutant(
            "attention_tile_tail_dropped",
            "attention never loads the keys past the last whole 64-key tile once a sequence passes one tile",
            "zml/zml#563 (a Triton attention kernel left the padding tail unmasked when the tile matched the block), "
            "triton-lang/triton#630 (a GEMM wrong once K is not a multiple of the block)",
            kernels.attention_tile_tail_dropped,
        ),
        Mutant(
            "softmax_without_max",
            "attention's softmax is exp(s) / sum exp(s) without subtracting the row maximum: NaN past a score of ~88.7",
            "ggml-org/llama.cpp#2665 (CUDA softmax without the max gave NaN at large scores), pytorch/executorch#18407 "
            "(Vulkan SDPA softmax overflowed float32 at a score of 151)",
            kernels.softmax_without_max,
        ),
        Mutant(
            "store_kv_int32_offsets",
            "the KV store computes a slot's element offset in 32 bits: past 2**31 elements it wraps to another slot",
            "vllm-project/vllm#1486 (slot mapping overflowed int32 on large pools), lightseekorg/tokenspeed#501, "
            "flashinfer-ai/flashinfer#3136 (page index times stride computed in 32 bits)",
            kernels.store_kv_int32_offsets,
        ),
        Mutant(
            "store_kv_one_past",
            "the KV store also writes the batch's last K/V one slot further on, into a slot it was not given",
            "gittensor-ai-lab/sparkinfer#289 (a KV write through the wrong index contaminated other sequences' KV)",
            kernels.store_kv_one_past,
        ),
        Mutant(
            "slot_check_counts_once",
            "the slot checks count the writes to a slot with a store instead of an add: a slot written twice in one "
            "batch passes",
            "vllm-project/vllm#37076 (one KV block handed to two requests at once), the Triton slot check's count "
            "kernel (engine/step/triton.py) states the same rule with atomics",
            kernels.slot_check_counts_once,
        ),
        Mutant(
            "input_ids_batch_index_as_row",
            "a pending token's id (the request's last sampled token) is read at the request's place in the batch, not "
            "at its row of the engine's last tokens: right only while rows happen to follow batch order",
            "sgl-project/sglang#25862 (the overlap scheduler's future tokens re-keyed from a ring slot to the "
            "request's pool row), sgl-project/sglang-jax#1487 (a pending token replaced by another batch's)",
            kernels.input_ids_batch_index_as_row,
        ),
        Mutant(
            "triton_input_ids_batch_index_as_row",
            "the same rule broken in the Triton input-ids kernel a captured step runs",
            "as input_ids_batch_index_as_row, on the kernel the CUDA targets run",
            kernels.triton_input_ids_batch_index_as_row,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "triton_slot_count_skipped",
            "the Triton slot check never launches its count kernel: a slot written twice or over cached KV passes",
            "the same rule as slot_check_counts_once, on the kernel the CUDA targets run",
            kernels.triton_slot_count_skipped,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "triton_hand_out_tail_dropped",
            "the Triton hand-out's grid rounds the vocabulary down to whole blocks: each row's tail is never copied",
            "tile-tail bugs: a grid of n // BLOCK for cdiv(n, BLOCK) (llama.cpp's test-backend-ops sizes each side of "
            "a block for these)",
            kernels.triton_hand_out_tail_dropped,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "keep_tokens_unclamped",
            "a sampled step keeps a row's -1 (nothing sampled) as its last token, so the next step's input id is -1",
            "sentinel values leaking into state: the -1 a kernel writes for 'no token' read back as an id",
            kernels.keep_tokens_unclamped,
        ),
        Mutant(
            "triton_keep_tokens_read_contiguous",
            "the Triton keep kernel reads the sampled tokens as contiguous: a strided view hands it other rows' tokens",
            "strided inputs read as contiguous (this project's hand-out read a plugin's strided tokens so, f6d75ca)",
            kernels.triton_keep_tokens_read_contiguous,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "triton_slot_flag_kept",
            "the Triton slot check of a decode batch never clears its flag: after one refused decode step of up to "
            "32 requests, every such step is refused",
            "state a step leaves for the next: a verdict or counter reused across launches without its reset",
            kernels.triton_slot_flag_kept,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "triton_rms_norm_undeclared_fallback",
            "the Triton RMSNorm hands batches of more than 8 rows to the torch reference without declaring it: the "
            "kernel under test is never exercised there",
            "sgl-project/sglang#4543-style silent fallbacks to a reference path; llama.cpp's test-backend-ops lists "
            "every op a backend does not run for the same reason",
            kernels.triton_rms_norm_undeclared_fallback,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "triton_rope_store_k_unrotated",
            "the fused q/k norm + RoPE + KV store writes k to the cache as loaded, before its norm and RoPE: q is "
            "rotated, the cached keys are not (bites targets with kernels=triton)",
            "sgl-project/sglang#19636, kvcache-ai/sglang#31 (a fused RoPE + KV-store kernel left a key unrotated "
            "where attention read it: q rotated, k not, gibberish on Qwen3)",
            kernels.triton_rope_store_k_unrotated,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "norm_gemv_rms_first_block",
            "the RMSNorm folded into the small-batch GEMV (decode's qkv and gate_up at one row) takes "
            "each row's sum of squares over the first K block only: rows wider than the block get the wrong rms",
            "triton-lang/triton#630 (a GEMM wrong once K is not a multiple of the block); fused norm prologues that "
            "reduce one tile (the reduction must span the whole row before the first weight tile is used)",
            kernels.norm_gemv_rms_first_block,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "gemv_grid_by_rule",
            "the one-row GEMV's launch grid is sized by the general block rule while its kernel takes a model "
            "shape's own block (ONE_ROW_BLOCKS): o_proj's 1024 x 2048 at one row, 2 columns a program against the "
            "rule's 4, leaves half its outputs unwritten",
            "pytorch/pytorch#195546 (a grid of half the programs left torch.empty outputs unwritten), "
            "NVIDIA/TransformerEngine#2975 and pytorch/pytorch#136550 (a grid sized for one block config launched "
            "with another)",
            kernels.gemv_grid_by_rule,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "gemm_k_tail_dropped",
            "the skinny GEMM (decode batches past GEMV_MAX_ROWS, up to GEMM_MAX_ROWS rows) runs whole K tiles only: "
            "a product whose K is off its 128-wide tile drops the last columns' terms",
            "triton-lang/triton#630 (a GEMM wrong once K is not a multiple of the block); split-K and tiled GEMMs "
            "whose loop bound is K // BLOCK_K",
            kernels.gemm_k_tail_dropped,
            device="cuda",
            needs=(("kernels", "triton"),),
        ),
        Mutant(
            "host_copy_unwaited",
            "the host tokens are read without waiting for the device-to-host copy's event",
            "vllm-project/vllm#45357 (a step's tokens used while the next step was still in flight)",
            kernels.host_copy_unwaited,
            device="cuda",
        ),
        # ---- batch invariance (issue #27): only the exact property sees these ----
        Mutant(
            "linear_rows_by_count",
            "in batch-invariant mode a projection's input shorter than one row block runs unpadded, so a lone "
            "decode row takes a GEMV and rounds unlike the same row in a batch's GEMM blocks",
            "thinking-machines-lab/batch_invariant_ops (matmul reduction order chosen by the batch size), "
            "vllm-project/vllm and sgl-project/sglang deterministic-inference modes",
            invariance.linear_rows_by_count,
            needs=(("invariant", True),),
        ),
        Mutant(
            "attention_decode_padded",
            "in batch-invariant mode decode batches still take one SDPA call over keys padded to the longest "
            "request and masked, so a request's attention depends on its batch-mates' lengths",
            "sgl-project/sglang deterministic inference (attention split fixed per sequence, not per batch), "
            "vllm-project/vllm batch-invariant attention",
            invariance.attention_decode_padded,
            needs=(("invariant", True),),
        ),
        Mutant(
            "norm_reduction_by_block_count",
            "in batch-invariant mode RMSNorm sums its squares in as many column blocks as the batch has rows, so a "
            "request's norm rounds differently alone and batched",
            "thinking-machines-lab/batch_invariant_ops (RMSNorm's reduction strategy chosen by the batch size), "
            "sgl-project/sglang deterministic inference (one reduction order per row)",
            invariance.norm_reduction_by_block_count,
            needs=(("invariant", True),),
        ),
        Mutant(
            "matmul_split_k_by_rows",
            "in batch-invariant mode on CUDA a lone row's projections split K in two halves summed after rounding "
            "(a split-K chosen from the batch to fill the GPU), so a request rounds differently alone and batched",
            "thinking-machines-lab/batch_invariant_ops (split-K and tile choices by batch size break invariance), "
            "sgl-project/sglang deterministic inference (fixed matmul configuration)",
            invariance.matmul_split_k_by_rows,
            device="cuda",
            needs=(("invariant", True),),
        ),
        # ---- stop tokens ----
        Mutant(
            "eos_from_config_only",
            "the stop set is config.json's eos_token_id alone: generation_config.json's list (HF generate's) is "
            "ignored, so a request runs on past an EOS id only that file names",
            "vllm-project/vllm#4180 and #4182 (Llama 3 Instruct ran past <|eot_id|>, listed only in "
            "generation_config.json), turboderp-org/exllamav2#449, huggingface/text-generation-inference#2678",
            model.eos_from_config_only,
        ),
    )
}
