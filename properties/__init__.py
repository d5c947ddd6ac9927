"""Property-based proof that the engine computes what Hugging Face transformers computes.

Run ``pytest properties/``. The Hypothesis profile comes from ``--hypothesis-profile`` or the
``HYPOTHESIS_PROFILE`` environment variable (``ci`` by default; ``deep`` for many random examples, ``dev`` for a
quick look); see ``properties/conftest.py``.

Modules:

* ``strategies``: public Hypothesis strategies (sampling params, batches, page layouts, prefix splits, logits).
* ``checks``: shared assertion logic (logit tolerances per dtype, vLLM's near-tie greedy rule), also used by the
  ``python -m oracle verify`` report.
* ``drive``: runs request specs through the engine (engines cached per configuration, driver, steps by hand).
* ``budget``: examples per test as a share of the profile, and the α budget of the statistical properties.
* ``test_*``: one module per property; each names its tolerance and why.
"""
