"""Benchmarks of the conversion job and the trainer, run from the repository's root
as ``python -m benchmarks.NAME`` (docs/benchmarks.md has each one's results).

Not part of the installed package: the wheel ships the job, the trainer and
the launchers only.
"""
