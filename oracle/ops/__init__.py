"""The op level: every replaceable kernel called alone on drawn boundary inputs, against HF's op sequence or its
exact value, inside guard regions, with proof of which implementation ran (properties/test_op_*.py, marker
``kernel``). Modules: bench (what a check runs on), ledger (which implementation ran), guard (poisoned buffers),
compare (the verdict and its message), strategies (boundary-seeking draws), references (HF's statements), and one
module per interface: layers, step, attention, sampler."""
