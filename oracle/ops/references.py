"""The op-level references: each op as HF states it, run at the op's dtype on the op's device (HF's own modules
and functions where transformers has them), or its exact value in float64 where the op's contract is a bound.

None of these call the engine's kernels, so a bug in the engine's torch reference (TorchKernels) is caught too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's LlamaRMSNorm (Qwen's is the same module) with `weight`, on x's device and dtype."""
    module = LlamaRMSNorm(x.shape[-1], eps=eps).to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        module.weight.copy_(weight)
        return module(x)


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """HF's MLP activation: act_fn(gate_proj) * up_proj, act_fn = SiLU, with gate and up as one merged row."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float, max_positions: int) -> torch.Tensor:
    """HF's rotary embedding of x [tokens, heads, head_dim] at `positions`: LlamaRotaryEmbedding's cos/sin (float32,
    cast to x's dtype) through apply_rotary_pos_emb."""
    tokens, heads, head_dim = x.shape
    config = LlamaConfig(
        hidden_size=heads * head_dim, num_attention_heads=heads, head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta}, max_position_embeddings=max_positions,
    )
    rotary = LlamaRotaryEmbedding(config).to(x.device)
    q = x.transpose(0, 1).unsqueeze(0)  # [1, heads, tokens, head_dim], HF's layout
    cos, sin = rotary(q, positions.unsqueeze(0))
    out, _ = apply_rotary_pos_emb(q, q, cos, sin)
    return out[0].transpose(0, 1)


def linear_exact(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x @ weight^T + bias, |x| @ |weight|^T + |bias|) in float64: the exact product of the rounded inputs and
    the magnitude its float32 accumulation error scales with."""
    x64, w64 = x.double(), weight.double()
    exact = x64 @ w64.T
    magnitude = x64.abs() @ w64.abs().T
    if bias is not None:
        exact = exact + bias.double()
        magnitude = magnitude + bias.double().abs()
    return exact, magnitude


def first_argmax(logits: torch.Tensor) -> torch.Tensor:
    """int32 [rows]: each row's first largest logit, -1 where it has nothing to choose (a NaN, a +inf, or only
    -inf), the engine's greedy rule (engine/sample.py) stated row by row."""
    out = []
    for row in logits.double().cpu():
        if bool(row.isnan().any()) or bool(row.isposinf().any()) or bool(row.isneginf().all()):
            out.append(-1)
        else:
            out.append(int((row == row.max()).nonzero()[0]))
    return torch.tensor(out, dtype=torch.int32)
