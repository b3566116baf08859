"""Shuffle keys and buckets (`pipeline.shard.batches`): where each record goes in the order."""

import numpy as np
import pytest

import mnist_contract as contract
from mnist_contract import framing, wire
from pipeline.source.sources import Batch

from pipeline.shard import batches


def _key(salt: str, split: str, index: int) -> bytes:
    return batches.shuffle_keys(salt, split, np.array([index])).tobytes()


def test_shuffle_key_is_stable_and_salted():
    assert _key("s", "train", 5) == _key("s", "train", 5)
    assert _key("s", "train", 5) != _key("t", "train", 5)
    assert _key("s", "train", 5) != _key("s", "test", 5)
    keys = batches.shuffle_keys("s", "train", np.arange(500))
    buckets = batches.buckets_of(keys, 4)
    assert set(buckets.tolist()) == set(range(16))
    # A bucket is the key's top bits.
    assert buckets.tolist() == [int.from_bytes(k[:4].tobytes(), "big") >> 28 for k in keys]


def test_shuffle_keys_are_distinct_and_give_an_unrelated_order():
    n = 100_000
    keys = batches.shuffle_keys("s", "train", np.arange(n))
    assert keys.shape == (n, batches.KEY_BYTES)
    assert keys[123].tobytes() == _key("s", "train", 123)  # batch-independent
    first = keys[:, :8].copy().view(">u8").reshape(-1)
    assert len(np.unique(first)) == n  # a bijection of the index: no ties
    order = np.argsort(first)
    # The sorted order is unrelated to the index order or to another salt's.
    assert abs(np.corrcoef(order, np.arange(n))[0, 1]) < 0.02
    other = np.argsort(batches.shuffle_keys("t", "train", np.arange(n))[:, :8].copy()
                       .view(">u8").reshape(-1))
    assert abs(np.corrcoef(order, other)[0, 1]) < 0.02
    # Neighbouring indices land far apart: each 1% of the order mixes the whole range.
    assert np.ptp(order[:n // 100]) > 0.95 * n


def test_take_rows_equals_fancy_indexing():
    rng = np.random.default_rng(5)
    for array in (rng.integers(0, 256, (40, 28, 28), dtype=np.uint8),
                  rng.integers(-9, 9, 40), np.zeros((0, 3), np.uint8)):
        order = rng.permutation(len(array))
        assert np.array_equal(batches.take_rows(array, order), array[order])


@pytest.mark.parametrize("image_format, first_index", [
    ("raw", 0),           # varints of 1 and 2 bytes: records of two lengths
    ("raw", 16_000),      # 2 and 3 bytes
    ("raw", 3_000_000),   # one length: framed by numpy as one block
    ("png", 100)])
def test_spill_batch_is_the_framed_records_in_key_order(image_format, first_index):
    rng = np.random.default_rng(first_index)
    n = 1000
    batch = Batch(np.arange(first_index, first_index + n, dtype=np.int64),
                  rng.integers(0, 256, (n, 28, 28), dtype=np.uint8),
                  rng.integers(0, contract.NUM_CLASSES, n).astype(np.int64))
    buckets, keys, data, lengths = batches.spill_batch(batch, "s", "train", image_format, 6)
    expected_keys = batches.shuffle_keys("s", "train", batch.indices)
    order = batches.key_order(expected_keys).tolist()
    framed = framing.frame_records(wire.encode_examples(
        {contract.IMAGE_KEY: batch.images, contract.LABEL_KEY: batch.labels,
         contract.INDEX_KEY: batch.indices}, image_format))
    assert bytes(memoryview(data)) == b"".join(framed[i] for i in order)
    assert lengths.tolist() == [len(framed[i]) for i in order]
    assert np.array_equal(keys, expected_keys[order])
    assert buckets.tolist() == batches.buckets_of(expected_keys[order], 6).tolist()


def test_in_key_order_agrees_with_sorting():
    keys = batches.shuffle_keys("s", "train", np.arange(2000))
    order = batches.key_order(keys)
    assert batches.in_key_order(keys[order]) and not batches.in_key_order(keys)
    tied = keys[order].copy()
    tied[5, :8] = tied[6, :8]  # equal first words: the second word decides
    tied[5, 8:], tied[6, 8:] = 255, 0
    assert not batches.in_key_order(tied)
    assert batches.in_key_order(keys[:1]) and batches.in_key_order(keys[:0])
