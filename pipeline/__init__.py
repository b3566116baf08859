"""MNIST → sharded TFRecords, as an Apache Beam job (docs/pipeline.md).

Its modules, the flow they make and what it shares with the trainer:
docs/pipeline.md, "Code layout".
"""
