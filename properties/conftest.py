"""The property suite's fixtures, options and Hypothesis profiles come from the harness's pytest plugin
(:mod:`oracle.pytest_plugin`, registered as a ``pytest11`` entry point); an uninstalled checkout passes
``-p oracle.pytest_plugin``."""
