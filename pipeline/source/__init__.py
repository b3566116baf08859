"""Where the digits come from: IDX files (local, gs://, https://), TFDS, the
offline sample, synthetic. Its modules: docs/pipeline.md, "Code layout".
"""
