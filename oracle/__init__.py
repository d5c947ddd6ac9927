"""The harness library: the HF reference, the exact sampler and statistics, targets, tolerances, strategies, checks,
the engine-driving helpers, the mutant catalogue and ``verify``."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("hfparity-engine")
except PackageNotFoundError:  # an uninstalled checkout (e.g. on PYTHONPATH)
    __version__ = "0+unknown"
