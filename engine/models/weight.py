"""Stream weights from *.safetensors (those an index names, else all) into a materialized model, merging q/k/v,
gate/up and per-expert MoE weights; a tensor that is not floating point, maps to no parameter or to one of another
shape, or a parameter left unfilled, raises ModelLoadError naming it.
"""

from __future__ import annotations

import re
import stat
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from ..errors import ModelLoadError
from ..layers.linear import Linear, MergedLinear
from ..moe.layer import EXPERT_PROJECTIONS, FusedMoE
from .config import read_json

# HF projection name → (our merged module, shard name).
_MERGED = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", "gate"),
    "up_proj": ("gate_up_proj", "up"),
}
_MERGED_RE = re.compile(r"^(.*)\.(" + "|".join(_MERGED) + r")\.(weight|bias)$")
# MoE experts stored apart fill shards of FusedMoE's 3-D weights; the fused form loads by name.
_EXPERT_RE = re.compile(r"^(.*\.experts)\.(\d+)\.(" + "|".join(EXPERT_PROJECTIONS) + r")\.weight$")
# Buffers some older checkpoints carry; they are recomputed, not loaded.
_IGNORED_RE = re.compile(r"rotary_emb\.inv_freq$")
INDEX = "model.safetensors.index.json"


def _target(name: str) -> tuple[str, str | None]:
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
    prefix, leaf = param_name.rsplit(".", 1)
    module = model.get_submodule(prefix)
    if isinstance(module, MergedLinear):
        return set(module.shard_offsets)
    if isinstance(module, FusedMoE):
        return set(module.shard_names(leaf))
    return {None}


def checkpoint_files(model_path: str | Path) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files to load and the index's tensor → file map (None without an index); each checked by
    stat to be a regular file first (a FIFO would block the load)."""
    root = Path(model_path)
    has_index = (root / INDEX).exists() or (root / INDEX).is_symlink()
    index = _read_index(root) if has_index else None
    if index is None:
        files = sorted(p.name for p in root.glob("*.safetensors"))
        if not files:
            raise ModelLoadError(
                f"no *.safetensors files in {str(model_path)!r}; convert the checkpoint with "
                "save_pretrained(..., safe_serialization=True)"
            )
    else:
        files = sorted(set(index.values()))
    for file in files:
        _check_regular(root, file, f" ({INDEX} names it)" if index is not None else "")
    return files, index


def _check_regular(root: Path, file: str, why: str = "") -> None:
    try:
        regular = stat.S_ISREG((root / file).stat().st_mode)
    except OSError:
        regular = False
    if not regular:
        raise ModelLoadError(f"{file!r} in {str(root)!r} is not a regular file{why}; put the file itself there")


def _inside(file: str) -> bool:
    path = PurePosixPath(file)
    return not path.is_absolute() and ".." not in path.parts


def _read_index(root: Path) -> dict[str, str]:
    _check_regular(root, INDEX)
    index = read_json(root / INDEX)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{INDEX} needs a non-empty 'weight_map' object mapping tensor names to files")
    for name, file in weight_map.items():
        if not isinstance(file, str):
            raise ModelLoadError(f"{INDEX} maps tensor {name!r} to {file!r}; use a file name")
        if not _inside(file):
            raise ModelLoadError(
                f"{INDEX} maps tensor {name!r} to {file!r}, outside the model directory; name a file in it"
            )
    return weight_map


def _check_names(file: str, names: list[str], index: dict[str, str] | None, seen: dict[str, str]) -> None:
    for name in names:
        if index is None and name in seen:
            raise ModelLoadError(f"tensor {name!r} is in both {seen[name]} and {file}; keep one copy")
        if index is not None and index.get(name) != file:
            where = f"maps it to {index[name]}" if name in index else "does not list it"
            raise ModelLoadError(f"tensor {name!r} is in {file}, but {INDEX} {where}")
        seen[name] = file
    if index is not None:
        present = set(names)
        absent = sorted(n for n, f in index.items() if f == file and n not in present)
        if absent:
            raise ModelLoadError(f"{INDEX} maps tensor {absent[0]!r} to {file}, which has no such tensor")


def _read(f: Any, name: str, file: str) -> torch.Tensor:
    value = f.get_tensor(name)
    if not value.dtype.is_floating_point:
        raise ModelLoadError(f"tensor {name!r} in {file} has dtype {value.dtype}; weights must be floating point")
    return value


def load_weights(model: nn.Module, model_path: str | Path, tied_embeddings: bool) -> None:
    """Fill every parameter from the checkpoint; a tensor-parallel layer takes its rank's slice."""
    params = dict(model.named_parameters())
    pending = {pname: _shards(model, pname) for pname in params}
    files, index = checkpoint_files(model_path)
    seen: dict[str, str] = {}
    for file in files:
        path = Path(model_path) / file
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                names = list(f.keys())
                _check_names(file, names, index, seen)
                for name in names:
                    if _IGNORED_RE.search(name):
                        continue
                    if name == "lm_head.weight" and tied_embeddings:
                        continue  # tied: the head reads the embedding
                    pname, target_shard = _target(name)
                    if pname not in params:
                        raise ModelLoadError(
                            f"unexpected tensor {name!r} in {file}: the architecture has no such weight"
                        )
                    value = _read(f, name, file)
                    _copy_tensor(model, params[pname], pname, target_shard, name, value)
                    left = pending.get(pname, set())
                    left.discard(target_shard)
                    if target_shard is None or not left:
                        pending.pop(pname, None)
        except SafetensorError as e:
            raise ModelLoadError(f"{file} is not a readable safetensors file ({e}); re-save it") from None
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
    if isinstance(owner, Linear):
        value = owner.load_slice(leaf, value)
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
    """Random weights for benchmarks: small normal values, norms at 1."""
    with torch.no_grad():
        for i, (name, param) in enumerate(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                gen = torch.Generator(device=param.device).manual_seed(seed + i)
                param.normal_(0.0, 0.02, generator=gen)
