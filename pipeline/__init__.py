"""MNIST → sharded TFRecords, as an Apache Beam job.

The flow, one folder or module per step:

    __main__, options        the command line, parsed once into `options.Options`
    source/                  where the digits come from (IDX, TFDS, sample, synthetic)
    shard/                   shuffle keys, the shard plan and the Beam graph
    publish/                 the output's lock, temp folder and crash-safe publish
    job                      runs one `Options` through those steps

Beside them: `storage` (the only file I/O), `errors`, `credentials`,
`stop` (a signal's clean stop), `progress`, `faults` (test fault points),
`verify` (``python -m pipeline.verify``), `preview` (its ``--preview``
picture) and `_compat` (every private Beam reach).
The data contract it writes lives in the neutral `mnist_contract` package,
which the trainer imports too; the rest the two share (the output lock, the
console: start-up, log format and exit statuses, one-line usage errors) in
the neutral `mnist_common` package.
"""
