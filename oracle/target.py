"""Target: what the harness checks, named once and handed to every property, ``verify`` and the mutant table.

A target is a device, an engine dtype, the attention backend, the layer kernels and the sampler (names in the
engine's registries, a plugin's included), CUDA graphs on or off, the page sizes the properties draw, and the
head_dim of the tiny random models (FlashInfer's smallest kernel is 64). It is parsed from a preset name with
optional ``key=value`` overrides (``cuda-bf16,page_sizes=1/16,graphs=off``) or from a TOML file holding the same
keys (``preset = "cuda-bf16"`` plus fields). ``HFPARITY_TARGET`` gives the default where no option is passed.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import ATTENTION_BACKENDS, LAYER_KERNELS, SAMPLERS, EngineConfig, Where
from engine.config import DTYPES
from engine.registry import Registry
from engine.sample import BaseSampler

from .tolerance import LOGIT_TOLERANCES, LogitTolerance, logit_tolerance

TARGET_ENV = "HFPARITY_TARGET"
DEFAULT = "cpu-fp32"


class TargetError(ValueError):
    """A target that does not parse, or cannot run on this machine; the message says which key and why."""


@dataclass(frozen=True)
class Target:
    name: str
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "torch"
    kernels: str = "torch"
    sampler: str = "torch"
    graphs: bool = False
    page_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    head_dim: int = 16

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def tolerance(self) -> LogitTolerance:
        return logit_tolerance(self.torch_dtype)

    def problems(self) -> list[str]:
        """Why this target cannot run here (empty when it can)."""
        out = []
        if self.device == "cuda" and not torch.cuda.is_available():
            out.append("device=cuda: no CUDA device is available here")
        if self.graphs and self.device != "cuda":
            out.append("graphs=on: CUDA graphs need device=cuda")
        if self.torch_dtype not in LOGIT_TOLERANCES:
            out.append(f"dtype={self.dtype}: the harness has no logit tolerance for it")
        if not out:
            where = Where(self.torch_device, self.torch_dtype, self.head_dim)
            for key, registry, name in (
                ("attention", ATTENTION_BACKENDS, self.attention),
                ("kernels", LAYER_KERNELS, self.kernels),
                ("sampler", SAMPLERS, self.sampler),
            ):
                reason = registry.unusable(name, where) if name != "auto" else None
                if reason is not None:
                    out.append(f"{key}={name}: {reason}")
        return out

    def resolved(self, field: str) -> object:
        """The field's value on this machine: attention, kernels and sampler as the registry resolves them ("auto"
        names what an engine would pick), the other fields as given."""
        registries: dict[str, Registry[Any]] = {
            "attention": ATTENTION_BACKENDS, "kernels": LAYER_KERNELS, "sampler": SAMPLERS,
        }
        value = getattr(self, field)
        if field in registries and value == "auto":
            return registries[field].resolve("auto", Where(self.torch_device, self.torch_dtype, self.head_dim))
        return value

    def require(self) -> Target:
        """self, or TargetError naming every reason it cannot run here."""
        problems = self.problems()
        if problems:
            raise TargetError(f"target {self.name!r} cannot run here: " + "; ".join(problems))
        return self

    def engine_config(self, model: str | Path, **fields: Any) -> EngineConfig:
        """An EngineConfig for `model` on this target; keyword arguments set the other fields (dtype included)."""
        settings: dict[str, Any] = {
            "device": self.device,
            "dtype": self.dtype,
            "attention_backend": self.attention,
            "layer_kernels": self.kernels,
            "sampler_backend": self.sampler,
            "cuda_graph_bs": None if self.graphs else [],
        }
        settings.update(fields)
        return EngineConfig(str(model), **settings)

    def make_sampler(self, vocab_size: int, seed: int) -> BaseSampler:
        """The target's token sampler on its device, as an engine would build it."""
        where = Where(self.torch_device, self.torch_dtype, self.head_dim)
        return SAMPLERS.factory(SAMPLERS.resolve(self.sampler, where))(self.torch_device, vocab_size, seed)

    def describe(self) -> dict[str, Any]:
        """The fields as plain data, for reports."""
        return dataclasses.asdict(self)


PRESETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("cpu-fp32"),
        Target("cpu-bf16", dtype="bfloat16"),
        Target(
            "cuda-bf16",
            device="cuda",
            dtype="bfloat16",
            attention="flashinfer",
            kernels="triton",
            sampler="flashinfer",
            graphs=True,
            page_sizes=(1, 4, 16),
            head_dim=64,
        ),
        Target("cuda-bf16-torch", device="cuda", dtype="bfloat16", page_sizes=(1, 4, 16), head_dim=64),
    )
}

_BOOLS = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


def _field(key: str, value: object) -> object:
    """A field value from a string (the short form) or a TOML value, checked."""
    if key == "graphs":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOLS:
            return _BOOLS[value.lower()]
        raise TargetError(f"graphs={value!r}: use on or off")
    if key == "page_sizes":
        items: Any = value.replace(":", "/").split("/") if isinstance(value, str) else value
        try:
            sizes = tuple(int(v) for v in items)
        except (TypeError, ValueError):
            raise TargetError(f"page_sizes={value!r}: use sizes separated by '/', e.g. 1/4/16") from None
        if not sizes or min(sizes) < 1:
            raise TargetError(f"page_sizes={value!r}: use one or more sizes >= 1")
        return sizes
    if key == "head_dim":
        try:
            dim = int(value)  # type: ignore[call-overload]
        except (TypeError, ValueError):
            raise TargetError(f"head_dim={value!r}: use an even int >= 2") from None
        if dim < 2 or dim % 2:
            raise TargetError(f"head_dim={value!r}: use an even int >= 2")
        return dim
    if not isinstance(value, str) or not value:
        raise TargetError(f"{key}={value!r}: use a name")
    if key == "device" and value not in ("cpu", "cuda"):
        raise TargetError(f"device={value!r}: use cpu or cuda")
    if key == "dtype":
        if value not in DTYPES:
            raise TargetError(f"dtype={value!r}: use one of {', '.join(sorted(DTYPES))}")
        return str(DTYPES[value]).removeprefix("torch.")
    return value


_KEYS = tuple(f.name for f in dataclasses.fields(Target) if f.name != "name")


def build(preset: str, overrides: Mapping[str, object], name: str) -> Target:
    if preset not in PRESETS:
        raise TargetError(f"unknown target preset {preset!r}; presets: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides) - set(_KEYS))
    if unknown:
        raise TargetError(f"unknown target key(s) {', '.join(unknown)}; keys: {', '.join(_KEYS)}")
    fields = {k: _field(k, v) for k, v in overrides.items()}
    return dataclasses.replace(PRESETS[preset], name=name, **fields)  # type: ignore[arg-type]


def parse(text: str) -> Target:
    """A target from a preset name with ``,key=value`` overrides, or from a ``.toml`` file (see the module doc)."""
    text = text.strip()
    if text.endswith(".toml"):
        path = Path(text)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise TargetError(f"target file {text}: {exc}") from None
        data = data.get("target", data)  # either top-level keys or a [target] table
        preset, name = str(data.pop("preset", DEFAULT)), str(data.pop("name", path.stem))
        return build(preset, data, name)
    head, *rest = [part.strip() for part in text.split(",")] if text else [DEFAULT]
    preset, pairs = (DEFAULT, [head, *rest]) if "=" in head else (head, rest)
    overrides: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise TargetError(f"target part {pair!r}: use key=value")
        overrides[key.strip()] = value.strip()
    return build(preset, overrides, text)


def from_env(option: str | None = None) -> Target:
    """The target named by `option`, else by $HFPARITY_TARGET, else the default (cpu-fp32)."""
    return parse(option or os.environ.get(TARGET_ENV) or DEFAULT)
