"""A target as written, without torch or the engine: the fields, the presets, and parsing of a preset name with
``,key=value`` overrides or a TOML file, so that a command line can reject a bad ``--target`` before importing
anything heavy. :mod:`oracle.target` adds what needs the engine: dtype names, whether it runs here, engine configs.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TARGET_ENV = "HFPARITY_TARGET"
DEFAULT = "cpu-fp32"
# The preset a suite of one device runs where no target is named (the GPU tests, a benchmark's cases).
DEVICE_DEFAULTS = {"cpu": DEFAULT, "cuda": "cuda-bf16"}


class TargetError(ValueError):
    """A target that does not parse, or cannot run on this machine; the message says which key and why."""


@dataclass(frozen=True)
class TargetSpec:
    name: str
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "torch"
    kernels: str = "torch"
    sampler: str = "torch"
    graphs: bool = False
    page_sizes: tuple[int, ...] = (1, 2, 4, 8, 16)
    head_dim: int = 16
    invariant: bool = False  # EngineConfig.batch_invariant

    def describe(self) -> dict[str, Any]:
        """The fields as plain data, for reports."""
        return dataclasses.asdict(self)


PRESETS: dict[str, TargetSpec] = {
    t.name: t
    for t in (
        TargetSpec("cpu-fp32"),
        TargetSpec("cpu-bf16", dtype="bfloat16"),
        TargetSpec(
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
        TargetSpec("cuda-bf16-torch", device="cuda", dtype="bfloat16", page_sizes=(1, 4, 16), head_dim=64),
    )
}

_BOOLS = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


def _int(value: object) -> int | None:
    """An int from an int or a decimal string, else None: a float, a bool or other text is refused, never truncated."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _field(key: str, value: object) -> object:
    """A field value from a string (the short form) or a TOML value, through the same checks (a dtype's name: by
    oracle.target)."""
    if key in ("graphs", "invariant"):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOLS:
            return _BOOLS[value.lower()]
        raise TargetError(f"{key}={value!r}: use on or off")
    if key == "page_sizes":
        use = "use sizes >= 1 separated by '/', e.g. 1/4/16 (in TOML, a list of ints)"
        items = value.replace(":", "/").split("/") if isinstance(value, str) else value
        sizes = [_int(v) for v in items] if isinstance(items, list) else []
        if not sizes or any(size is None or size < 1 for size in sizes):
            raise TargetError(f"page_sizes={value!r}: {use}")
        return tuple(sizes)
    if key == "head_dim":
        dim = _int(value)
        if dim is None or dim < 2 or dim % 2:
            raise TargetError(f"head_dim={value!r}: use an even int >= 2")
        return dim
    if not isinstance(value, str) or not value:
        raise TargetError(f"{key}={value!r}: use a name")
    if key == "device" and value not in ("cpu", "cuda"):
        raise TargetError(f"device={value!r}: use cpu or cuda")
    return value


KEYS = tuple(f.name for f in dataclasses.fields(TargetSpec) if f.name != "name")
# The keys engine.config.INVARIANT_BACKENDS names, in its order: `cuda-bf16,invariant=on` needs no more keys.
INVARIANT_KEYS = ("attention", "kernels")


def build(preset: str, overrides: Mapping[str, object], name: str) -> TargetSpec:
    if preset not in PRESETS:
        raise TargetError(f"unknown target preset {preset!r}; presets: {', '.join(PRESETS)}")
    unknown = sorted(set(overrides) - set(KEYS))
    if unknown:
        raise TargetError(f"unknown target key(s) {', '.join(unknown)}; keys: {', '.join(KEYS)}")
    fields = {k: _field(k, v) for k, v in overrides.items()}
    spec = dataclasses.replace(PRESETS[preset], name=name, **fields)  # type: ignore[arg-type]
    if spec.invariant:  # "auto": what batch invariance runs on the device (oracle.target names it), unless named
        picked = {k: "auto" for k in INVARIANT_KEYS if k not in overrides}
        spec = dataclasses.replace(spec, **picked)  # type: ignore[arg-type]
    return spec


def _name(key: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise TargetError(f"{key}={value!r}: use a name (a TOML string)")
    return value


def _from_toml(path: Path) -> TargetSpec:
    """A target from a TOML file: its keys at the top level or in a [target] table."""
    try:
        data = tomllib.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise TargetError(f"not UTF-8 text: {exc}") from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise TargetError(str(exc)) from None
    table = data.get("target", data)
    if not isinstance(table, dict):
        raise TargetError(f"target={table!r}: use a [target] table, or the keys at the top level")
    fields = dict(table)
    preset = _name("preset", fields.pop("preset", DEFAULT))
    return build(preset, fields, _name("name", fields.pop("name", path.stem)))


@contextmanager
def naming_file(text: str) -> Iterator[None]:
    """A TargetError raised within, prefixed with the TOML file `text` names (the short form's: unchanged)."""
    try:
        yield
    except TargetError as exc:
        if not text.strip().endswith(".toml"):
            raise
        raise TargetError(f"target file {text.strip()}: {exc}") from None


def parse_spec(text: str) -> TargetSpec:
    """A target from a preset name with ``,key=value`` overrides, or from a ``.toml`` file (see the module doc)."""
    text = text.strip()
    path = target_file(text)
    if path is not None:
        with naming_file(text):
            return _from_toml(path)
    head, *rest = [part.strip() for part in text.split(",")] if text else [DEFAULT]
    preset, pairs = (DEFAULT, [head, *rest]) if "=" in head else (head, rest)
    overrides: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise TargetError(f"target part {pair!r}: use key=value")
        overrides[key.strip()] = value.strip()
    return build(preset, overrides, text)


def target_file(text: str) -> Path | None:
    """The TOML file a target text names (an input no output may overwrite), or None for a preset."""
    return Path(text.strip()) if text.strip().endswith(".toml") else None


def named_text(option: str | None = None) -> str | None:
    """How the target is named: `option`, else $HFPARITY_TARGET; None where neither names one."""
    return option or os.environ.get(TARGET_ENV) or None


def target_text(option: str | None = None) -> str:
    """How the target is named: `option`, else $HFPARITY_TARGET, else the default (cpu-fp32)."""
    return named_text(option) or DEFAULT
