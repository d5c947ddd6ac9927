"""Worked examples: driving the engine by hand (drive_engine.py) and a plugin with one's own kernel
(my_attention.py)."""
