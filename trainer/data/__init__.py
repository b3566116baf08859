"""The input: what a dataset folder holds and how it becomes batches.

Its modules: docs/trainer.md, "Code layout".
"""
