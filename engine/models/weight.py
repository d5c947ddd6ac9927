"""Stream weights from *.safetensors into a materialized model, merging q/k/v and gate/up.

Every checkpoint tensor must map to exactly one parameter (or shard of a merged one) with the same shape,
and every parameter must be filled; otherwise ModelLoadError names the tensor.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ..errors import ModelLoadError
from ..layers.linear import MergedLinear

# HF projection name → (our merged module, shard name).
_MERGED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_MERGED_RE = re.compile(r"^(.*)\.(" + "|".join(_MERGED) + r")\.(weight|bias)$")
# Buffers some older checkpoints carry; they are recomputed, not loaded.
_IGNORED_RE = re.compile(r"rotary_emb\.inv_freq$")


def _target(name: str) -> tuple[str, str | None]:
    """HF tensor name → (our parameter name, shard or None)."""
    m = _MERGED_RE.match(name)
    if m is None:
        return name, None
    prefix, proj, kind = m.groups()
    module, shard = _MERGED[proj]
    return f"{prefix}.{module}.{kind}", shard


def _merged_owner(model: nn.Module, param_name: str) -> MergedLinear:
    module = model.get_submodule(param_name.rsplit(".", 1)[0])
    assert isinstance(module, MergedLinear)
    return module


def safetensors_files(model_path: str | Path) -> list[Path]:
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ModelLoadError(
            f"no *.safetensors files in {str(model_path)!r}; convert the checkpoint with "
            "save_pretrained(..., safe_serialization=True)"
        )
    return files


def load_weights(model: nn.Module, model_path: str | Path, tied_embeddings: bool) -> None:
    params = dict(model.named_parameters())
    # Each (param, shard) that still needs a value; shards of merged layers count separately.
    pending: set[tuple[str, str | None]] = set()
    for pname in params:
        module = model.get_submodule(pname.rsplit(".", 1)[0])
        if isinstance(module, MergedLinear):
            pending.update((pname, shard) for shard in module.shard_offsets)
        else:
            pending.add((pname, None))

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
                    _copy_tensor(model, params[pname], pname, target_shard, name, f.get_tensor(name))
                    pending.discard((pname, target_shard))
        except SafetensorError as e:
            raise ModelLoadError(f"{path.name} is not a readable safetensors file ({e}); re-save it") from None
        except OSError as e:
            raise ModelLoadError(f"cannot read {path}: {e}") from None
    if pending:
        missing = sorted(_hf_name(p, s) for p, s in pending)
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        raise ModelLoadError(f"missing tensor(s) in {str(model_path)!r}: {', '.join(missing[:8])}{more}")


def _hf_name(pname: str, shard: str | None) -> str:
    if shard is None:
        return pname
    prefix, module, kind = pname.rsplit(".", 2)
    proj = next(p for p, (m, s) in _MERGED.items() if m == module and s == shard)
    return f"{prefix}.{proj}.{kind}"


def _copy_tensor(
    model: nn.Module, param: torch.Tensor, pname: str, shard: str | None, name: str, value: torch.Tensor
) -> None:
    if shard is None:
        dest = param.data
    else:
        start, size = _merged_owner(model, pname).shard_offsets[shard]
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
