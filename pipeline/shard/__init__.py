"""Records to shards: shuffle keys, buckets, the shard plan and the Beam graph that writes them.

`config` holds every size the job reasons with; `batches` makes a source
batch ready to shuffle; `sharding` plans shards from byte counts;
`transforms` is the Beam graph; `shard_io` writes shards and spill files;
`overlap` runs a worker's I/O beside its encoding.
"""
