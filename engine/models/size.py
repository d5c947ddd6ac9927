"""The checkpoint must be large enough for its config, checked by arithmetic before any layer is built."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelLoadError
from .config import ModelConfig
from .weight import checkpoint_files

# Half a byte per parameter: 4-bit floats are the narrowest weights a checkpoint may hold.
_MIN_BITS = 4


def min_parameters(cfg: ModelConfig) -> int:
    """A lower bound of the parameters of cfg, without iterating over the layers."""
    embed = cfg.vocab_size * cfg.hidden_size * (1 if cfg.tie_word_embeddings else 2)
    attention = cfg.hidden_size * cfg.head_dim * 2 * (cfg.num_qo_heads + cfg.num_kv_heads)
    dense = 3 * cfg.hidden_size * cfg.intermediate_size
    experts = 3 * cfg.hidden_size * cfg.moe_intermediate_size * cfg.num_experts
    sparse = 0
    if cfg.num_experts > 0:
        step = cfg.decoder_sparse_step
        sparse = cfg.num_layers // step - sum(1 for i in set(cfg.mlp_only_layers) if (i + 1) % step == 0)
    return embed + cfg.num_layers * attention + (cfg.num_layers - sparse) * dense + sparse * experts


def check_checkpoint_size(cfg: ModelConfig, model_path: str | Path) -> None:
    root = Path(model_path)
    files, _ = checkpoint_files(root)
    size = sum((root / file).stat().st_size for file in files)
    params = min_parameters(cfg)
    if params * _MIN_BITS > size * 8:
        raise ModelLoadError(
            f"config.json describes at least {params:,} parameters (vocab_size={cfg.vocab_size}, "
            f"hidden_size={cfg.hidden_size}, intermediate_size={cfg.intermediate_size}, "
            f"num_hidden_layers={cfg.num_layers}, num_experts={cfg.num_experts}), more than the {size:,} bytes of "
            f"{', '.join(files)} in {str(root)!r} can hold; fix config.json or the checkpoint"
        )
