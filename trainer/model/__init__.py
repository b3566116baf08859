"""The model: what is trained and what is served.

Its modules: docs/trainer.md, "Code layout".
"""
