"""Where the digits come from: IDX files (local, gs://, https://), TFDS, the
offline sample, synthetic.

`sources.parse_source` turns ``--source`` into a picklable source object;
`idx` decodes the IDX format; `download` fetches over HTTPS into a cache.
"""
