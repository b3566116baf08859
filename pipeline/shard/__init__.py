"""Records to shards: shuffle keys, buckets, the shard plan and the Beam graph that writes them.

Its modules: docs/pipeline.md, "Code layout".
"""
