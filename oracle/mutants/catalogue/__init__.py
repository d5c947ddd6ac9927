"""The mutants' patches: bug patterns that inference engines have shipped, each as a reversible monkeypatch, in one
module per part of the engine it patches (sampling, attention, kv, step, model, driver, kernels). Every mutant
replaces one engine function or method with a small function written here that carries the bug; the engine's files
are never edited. Where it can, a replacement wraps the original and corrupts only its input or output (a shifted
position, a swapped slot, a dropped mask), so each mutant differs from the real engine in exactly the one way its bug
describes, and keeps up with the engine as it evolves. Each module takes the originals it wraps (``_ORIGINAL_*``)
when it is imported, which :mod:`oracle.mutants` does before any patch can be applied.
"""
