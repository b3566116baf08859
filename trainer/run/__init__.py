"""What keeps a run safe and its ``model_dir`` whole, apart from the ML.

Its modules: docs/trainer.md, "Code layout".
"""
