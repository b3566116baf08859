"""MNIST → sharded TFRecords, as an Apache Beam job.

Importing this package is cheap and pulls in no Beam: the trainer imports
`pipeline.contract`. The job itself lives in `pipeline.job`.
"""
