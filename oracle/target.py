"""Target: what the harness checks, named once and handed to every property, ``verify`` and the mutant table.

A target is a device, an engine dtype, the attention backend, the layer kernels and the sampler (names in the
engine's registries, a plugin's included), CUDA graphs on or off, batch invariance on or off, the page sizes the
properties draw, and the head_dim of the tiny random models (FlashInfer's smallest kernel is 64). It is parsed from
a preset name with optional ``key=value`` overrides (``cuda-bf16,page_sizes=1/16,graphs=off``) or from a TOML file
holding the same keys (``preset = "cuda-bf16"`` plus fields). ``HFPARITY_TARGET`` gives the default where no option
is passed. The fields, presets and parsing live in the torch-free :mod:`oracle.target_spec`; this module checks the
dtype's name and adds what needs the engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine import ATTENTION_BACKENDS, LAYER_KERNELS, SAMPLERS, STEP_KERNELS, EngineConfig, Where
from engine.config import DTYPES, INVARIANT_BACKENDS
from engine.registry import Registry
from engine.sample import BaseSampler

from .target_spec import (
    DEFAULT,
    INVARIANT_KEYS,
    TARGET_ENV,
    TargetError,
    TargetSpec,
    naming_file,
    parse_spec,
    target_text,
)
from .target_spec import PRESETS as SPECS
from .tolerance import LOGIT_TOLERANCES, LogitTolerance, logit_tolerance

__all__ = ["DEFAULT", "PRESETS", "TARGET_ENV", "Target", "TargetError", "from_env", "parse"]


@dataclass(frozen=True)
class Target(TargetSpec):
    @classmethod
    def of(cls, spec: TargetSpec) -> Target:
        """The spec as a Target, its dtype checked against the engine's names and spelled canonically; with invariant
        on, attention and kernels "auto" become the engine's INVARIANT_BACKENDS of the device."""
        if spec.dtype not in DTYPES:
            raise TargetError(f"dtype={spec.dtype!r}: use one of {', '.join(sorted(DTYPES))}")
        fields = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
        if spec.invariant and spec.device in INVARIANT_BACKENDS:  # "auto" names what batch invariance runs there
            invariant = dict(zip(INVARIANT_KEYS, INVARIANT_BACKENDS[spec.device]))
            fields |= {k: v for k, v in invariant.items() if fields[k] == "auto"}
        return cls(**fields | {"dtype": str(DTYPES[spec.dtype]).removeprefix("torch.")})

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def tolerance(self) -> LogitTolerance:
        return logit_tolerance(self.torch_dtype)

    @property
    def step_kernels(self) -> str:
        """The step kernels that go with the layer kernels: the same name where STEP_KERNELS has it, else "auto"."""
        return self.kernels if self.kernels in STEP_KERNELS else "auto"

    def problems(self) -> list[str]:
        """Why this target cannot run here (empty when it can)."""
        out = []
        if self.device == "cuda" and not torch.cuda.is_available():
            out.append("device=cuda: no CUDA device is available here")
        if self.graphs and self.device != "cuda":
            out.append("graphs=on: CUDA graphs need device=cuda")
        wanted = INVARIANT_BACKENDS.get(self.device)
        if self.invariant and (self.attention, self.kernels) != wanted:
            out.append(
                f"invariant=on: batch invariance runs on {self.device} with attention={wanted[0]} and kernels="
                f"{wanted[1]}" if wanted else f"invariant=on: batch invariance does not run on {self.device}"
            )
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
            "step_kernels": self.step_kernels,
            "sampler_backend": self.sampler,
            "cuda_graph_bs": None if self.graphs else [],
            "batch_invariant": self.invariant,
        }
        settings.update(fields)
        return EngineConfig(str(model), **settings)

    def make_sampler(self, vocab_size: int, seed: int) -> BaseSampler:
        """The target's token sampler on its device, as an engine would build it, but with no logits dtype declared:
        it takes any float32 logits (BaseSampler.declare_logits_dtype)."""
        where = Where(self.torch_device, self.torch_dtype, self.head_dim)
        return SAMPLERS.factory(SAMPLERS.resolve(self.sampler, where))(self.torch_device, vocab_size, seed)


PRESETS: dict[str, Target] = {name: Target.of(spec) for name, spec in SPECS.items()}


def parse(text: str) -> Target:
    """A target from a preset name with ``,key=value`` overrides, or from a ``.toml`` file (see the module doc)."""
    spec = parse_spec(text)
    with naming_file(text):  # the dtype's check, which needs torch, names the file like parse_spec's
        return Target.of(spec)


def from_env(option: str | None = None) -> Target:
    """The target named by `option`, else by $HFPARITY_TARGET, else the default (cpu-fp32)."""
    return parse(target_text(option))
