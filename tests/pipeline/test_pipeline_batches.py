"""Shuffle keys and buckets (`pipeline.shard.batches`): where each record goes in the order."""

import numpy as np

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
