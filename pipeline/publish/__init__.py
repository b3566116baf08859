"""The output folder: one writer at a time (`lock`), a temp folder and the run's
checks (`output`), the crash-safe move into place (`journal`) and TFDS's
metadata files (`metadata`).
"""
