"""The output folder: one writer at a time, a temp folder, the crash-safe
move into place and TFDS's metadata files. Its modules: docs/pipeline.md,
"Code layout".
"""
