"""The shard plan (`pipeline.shard.sharding`): shard counts, bucket bits, balanced bytes."""

import numpy as np

from pipeline.shard import sharding
from pipeline.shard.config import SHARDS


def test_num_shards_formula():
    assert SHARDS.shard_count(1000, 100, 1) == 10
    assert SHARDS.shard_count(1001, 100, 1) == 11
    assert SHARDS.shard_count(50, 100, 4) == 4
    assert sharding.num_shards_for(1000, 100, 1, 10_000) == 10
    assert sharding.num_shards_for(1001, 100, 1, 10_000) == 11
    assert sharding.num_shards_for(50, 100, 4, 10_000) == 4
    assert sharding.num_shards_for(10**9, 100, 1, 3) == 3


def test_bucket_bits_grow_with_shards():
    assert sharding.bucket_bits_for(10**6, 10**8, 1) == SHARDS.min_bucket_bits + 2
    assert sharding.bucket_bits_for(10**9, 10**8, 1) == 12
    assert sharding.bucket_bits_for(10**15, 10**8, 1) == SHARDS.max_bucket_bits


def test_plan_shards_balances_bytes():
    rng = np.random.default_rng(1)
    sizes = {b: (1, int(s)) for b, s in enumerate(rng.integers(200, 400, 4096))}
    plan = sharding.plan_shards(sizes, target_shard_bytes=60_000, min_shards=1)
    total = sum(s for _, s in sizes.values())
    assert plan.num_shards == -(-total // 60_000)
    per_shard = np.zeros(plan.num_shards)
    for bucket, (_, size) in sizes.items():
        per_shard[plan.bucket_to_shard[bucket]] += size
    assert np.all(np.abs(per_shard / per_shard.mean() - 1) <= 0.10)
    # Buckets are contiguous ranges of the shuffle order: shards must be too.
    assert [plan.bucket_to_shard[b] for b in sorted(sizes)] == sorted(
        plan.bucket_to_shard.values())


def test_plan_shards_never_leaves_an_empty_shard():
    plan = sharding.plan_shards({0: (1, 10), 7: (1, 1000)}, target_shard_bytes=1,
                                min_shards=2)
    assert plan.num_shards == 2
    plan = sharding.plan_shards({3: (5, 1000)}, target_shard_bytes=10, min_shards=1)
    assert plan.num_shards == 1 and plan.bucket_to_shard == {3: 0}
