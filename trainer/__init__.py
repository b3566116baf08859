"""Trains on the pipeline's TFRecords under any tf.distribute strategy (TPU included)."""
