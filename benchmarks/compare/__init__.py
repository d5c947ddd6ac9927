"""Side-by-side ratios in one process and one run: this engine against HF generate, and against the hardware.

    python -m benchmarks.compare [--device cpu|cuda] [--target T] [--quick] [--json PATH] [--sections ...]

The engine runs a target (oracle.target): --target, else cpu-fp32 on CPU and cuda-bf16 on CUDA; HF runs its dtype.

1. Controlled grid: B requests with the same random prompts, greedy, EOS ignored, n new tokens each, through
   this engine (eager, and with CUDA graphs on GPU), HF generate eager (DynamicCache) and HF generate with a
   static cache + torch.compile (GPU). Reports output tokens/s (B * n / wall time of the whole call, prefill
   included) and ms per decode step.
   ms per decode step = (T(n) - T(1)) / (n - 1), where T(k) is the wall time of a whole call that makes k tokens:
   both calls run the same prefill and first sample, so the difference is n - 1 decode steps, with every per-step
   overhead (scheduling, sampling, cache updates) included and no hook inside the loop to perturb it. The same
   method is applied to every contender. Repeats run interleaved (each contender once per round), and each ratio
   is the median over rounds of the ratio within a round, so load from other processes hits both sides alike.
   --sampling greedy,mixed,seeded adds the engine's sampled rows (HF runs greedy only), each with its ratio to the
   greedy row: mixed cycles top-k, top-p, min-p and greedy requests, seeded samples each with a seed of its own.
2. Roofline (GPU): device bandwidth from a large device-to-device copy (read + write bytes), in the same run.
   floor = (weight bytes read + KV bytes read) / bandwidth per decode step; reports step / floor per B.
3. Offline workload (GPU), shaped like nano-vllm's bench: 256 requests, random token ids, input and output
   lengths U(100, 1024), EOS ignored, seed 0, through the static driver with a prefill token budget. Reports
   total output tokens/s, once per mode of --offline-sampling (greedy, mixed, seeded).
4. Step profile (--profile): per B and sampling mode, the engine's graphs contender (eager without graphs) as a
   repeated decode step: device kernels and their summed device time per step (torch.profiler; None on CPU), and
   the host wall time until a step's launch returned.

HF static+compile runs in a persistent child process of its own (--isolate NAMES picks which HF contenders do):
once its compiled CUDA graph trees had run in this process, the engine's next B=64 call on an H200 died with an
illegal memory access, which the engine alone never did. The child times each call itself, as timed_both does,
and the rounds stay interleaved across the two processes.
"""

from .cli import main, name_set
from .contenders import ENGINE_EAGER, ENGINE_GRAPHS, HF_EAGER, HF_STATIC, Contender, IsolatedHF
from .grid import GridRow, run_grid
from .offline import run_offline
from .plan import Plan
from .report import print_report
from .roofline import measure_bandwidth, run_roofline

__all__ = [
    "ENGINE_EAGER",
    "ENGINE_GRAPHS",
    "HF_EAGER",
    "HF_STATIC",
    "Contender",
    "GridRow",
    "IsolatedHF",
    "Plan",
    "main",
    "measure_bandwidth",
    "name_set",
    "print_report",
    "run_grid",
    "run_offline",
    "run_roofline",
]
