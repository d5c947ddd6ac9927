"""Property-based proof that the engine computes what Hugging Face transformers computes.

Run ``pytest properties/`` (``--target`` picks what is checked, e.g. ``--target cuda-bf16``; ``--plugin MODULE``
loads one's own kernels). One module per property (``test_*``), each naming its tolerance and why. The strategies,
tolerances, checks, budgets and engine-driving helpers they use are library modules of :mod:`oracle`
(``oracle.strategies``, ``oracle.tolerance``, ``oracle.checks``, ``oracle.budget``, ``oracle.drive``); the
fixtures, options and Hypothesis profiles come from :mod:`oracle.pytest_plugin`.
"""
