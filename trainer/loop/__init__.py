"""The training loop, Orbit's split: one controller, two inner loops.

Its modules: docs/trainer.md, "Code layout".
"""
