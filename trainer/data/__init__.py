"""The input: what a dataset folder holds and how it becomes batches.

`splits` reads the conversion job's ``manifest.json`` and lists each
split's files; `checks` holds those files to the manifest (sizes, sha256,
image format, the eval count); `input_pipeline` turns a split into
``tf.data`` batches for every replica (``distribute_datasets_from_function``),
sharded per input pipeline; `in_memory` cuts the batches of a train split
held decoded in memory (``--cache``) from each epoch's permutation.
Everything goes through ``tf.io.gfile``, so a local folder, ``gs://`` and ``ram://`` read alike.
"""
