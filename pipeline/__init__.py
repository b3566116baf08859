"""MNIST → sharded TFRecords, as an Apache Beam job.

The data contract it writes lives in the neutral `mnist_contract` package,
which the trainer imports too. The job itself lives in `pipeline.job`.
"""
