"""Stream weights from *.safetensors into a materialized model, merging q/k/v, gate/up and per-expert MoE weights.

Every checkpoint tensor must map to exactly one parameter (or shard of a merged one) with the same shape,
and every parameter must be filled; otherwise ModelLoadError names the tensor.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ..errors import ModelLoadError
from ..layers.linear import MergedLinear
from ..moe.layer import EXPERT_PROJECTIONS, FusedMoE

# HF projection name → (our merged module, shard name).
_MERGED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_MERGED_RE = re.compile(r"^(.*)\.(" + "|".join(_MERGED) + r")\.(weight|bias)$")
# MoE experts stored apart (transformers' default save_pretrained, and older checkpoints) fill shards of
# FusedMoE's 3-D weights; the fused form (`experts.gate_up_proj`, `experts.down_proj`) loads by name.
_EXPERT_RE = re.compile(r"^(.*\.experts)\.(\d+)\.(" + "|".join(EXPERT_PROJECTIONS) + r")\.weight$")
# Buffers some older checkpoints carry; they are recomputed, not loaded.
_IGNORED_RE = re.compile(r"rotary_emb\.inv_freq$")


def _target(name: str) -> tuple[str, str | None]:
    """HF tensor name → (our parameter name, shard or None)."""
    m = _EXPERT_RE.match(name)
    if m is not None:
        prefix, expert, proj = m.groups()
        return f"{prefix}.{EXPERT_PROJECTIONS[proj][0]}", f"{expert}.{proj}"
    m = _MERGED_RE.match(name)
    if m is None:
        return name, None
    prefix, proj, kind = m.groups()
    module, shard = _MERGED[proj]
    return f"{prefix}.{module}.{kind}", shard


def _shards(model: nn.Module, param_name: str) -> set[str | None]:
    """What must be loaded to fill a parameter: the whole tensor (None), or each of its shards."""
    prefix, leaf = param_name.rsplit(".", 1)
    module = model.get_submodule(prefix)
    if isinstance(module, MergedLinear):
        return set(module.shard_offsets)
    if isinstance(module, FusedMoE):
        return set(module.shard_names(leaf))
    return {None}


def safetensors_files(model_path: str | Path) -> list[Path]:
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"no *.safetensors files in {str(model_path)!r}; convert the checkpoint with "
            "save_pretrained(..., safe_serialization=True)"
        )
    return files


def load_weights(
    model: nn.Module,
    model_path: str | Path,
    tied_embeddings: bool,
    shard: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """shard: maps a checkpoint tensor to this rank's slice of it (tensor parallelism); None keeps it whole."""
    params = dict(model.named_parameters())
    # param → the shards that still need a value; a whole tensor (shard None) fills every shard at once.
    pending = {pname: _shards(model, pname) for pname in params}

    for path in safetensors_files(model_path):
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118  (safe_open is not a dict)
                    if _IGNORED_RE.search(name):
                        continue
                    if name == "lm_head.weight" and tied_embeddings:
                        continue  # tied: the head reads the embedding
                    pname, target_shard = _target(name)
                    if pname not in params:
                        raise ModelLoadError(
                            f"unexpected tensor {name!r} in {path.name}: the architecture has no such weight"
                        )
                    value = f.get_tensor(name)
                    if shard is not None:
                        value = shard(name, value)
                    _copy_tensor(model, params[pname], pname, target_shard, name, value)
                    left = pending.get(pname, set())
                    left.discard(target_shard)
                    if target_shard is None or not left:
                        pending.pop(pname, None)
        except SafetensorError as e:
            raise ModelLoadError(f"{path.name} is not a readable safetensors file ({e}); re-save it") from None
        except OSError as e:
            raise ModelLoadError(f"cannot read {path}: {e}") from None
    if pending:
        missing = sorted(_hf_name(p, s) for p, shards in pending.items() for s in shards)
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise ModelLoadError(f"missing tensor(s) in {str(model_path)!r}: {', '.join(missing[:8])}{more}")


def _hf_name(pname: str, shard: str | None) -> str:
    if shard is None:
        return pname
    if "." in shard:  # an expert's projection, "<e>.<proj>"
        return f"{pname.rsplit('.', 1)[0]}.{shard}.weight"
    prefix, module, kind = pname.rsplit(".", 2)
    proj = next(p for p, (m, s) in _MERGED.items() if m == module and s == shard)
    return f"{prefix}.{proj}.{kind}"


def _copy_tensor(
    model: nn.Module, param: torch.Tensor, pname: str, shard: str | None, name: str, value: torch.Tensor
) -> None:
    prefix, leaf = pname.rsplit(".", 1)
    owner = model.get_submodule(prefix)
    if shard is None:
        dest = param.data
    elif isinstance(owner, FusedMoE):
        dest = owner.shard_view(leaf, shard)
    else:
        assert isinstance(owner, MergedLinear)
        start, size = owner.shard_offsets[shard]
        dest = param.data.narrow(0, start, size)
    if tuple(dest.shape) != tuple(value.shape):
        raise ModelLoadError(
            f"tensor {name!r} has shape {tuple(value.shape)}, but the model config expects {tuple(dest.shape)}"
        )
    with torch.no_grad():
        dest.copy_(value.to(dest.dtype))


def fill_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Random weights for benchmarks: small normal values, norms at 1, so activations stay finite."""
    with torch.no_grad():
        for i, (name, param) in enumerate(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                # Generated on the parameter's own device: an 8B model would take minutes through the CPU.
                gen = torch.Generator(device=param.device).manual_seed(seed + i)
                param.normal_(0.0, 0.02, generator=gen)
