"""Machinery the conversion job and the trainer share that is not the data contract.

A neutral package beside `mnist_contract`: `pipeline` and `trainer` import
it, it imports neither of them (nor Apache Beam, nor TensorFlow at import
time).

    storage_lock   one writer per folder: the lock file and its backends
                   (local disk, gs://, other tf.io.gfile schemes), with the
                   guarantee each one gives; acquire, refresh, check, release
    storage_errors a storage failure found and named in a few words
    local_paths    every delete and move, none through a symbolic link;
                   a FIFO refused where a data file is read
    console        what the command-line programs print and how they exit:
                   TensorFlow's start-up kept quiet, the log format, the
                   exit-status table
    stop           stopping on SIGTERM, SIGINT or SIGHUP: the `Stopped`
                   exception, the handlers set and put back, a step that
                   holds the signal until it ends (`deferred`)
    flags          usage errors as one line, naming the flag a misspelled
                   one was probably meant as
"""
