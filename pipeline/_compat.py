"""Every place the job reaches into Apache Beam beyond its public API.

Each reach was checked against apache-beam 2.77.0 (the version
pyproject.toml pins); a Beam upgrade re-checks this module and nothing else.
Beam is imported inside each function, so importing this module costs nothing.
"""

from __future__ import annotations

import functools


def set_gcs_retry_deadline(deadline_s: float) -> None:
    """Gives every Beam ``GcsIO`` retry policy the deadline ``deadline_s``.

    Beam 2.77.0: `apache_beam.io.gcp.gcsio_retry.get_retry` returns one of
    two module-level ``google.api_core.retry.Retry`` objects, ``DEFAULT_RETRY``
    and ``DEFAULT_RETRY_WITH_THROTTLING_COUNTER``; they are replaced by copies
    with the deadline (``Retry.with_timeout``). Opening a file for reading
    also reloads the blob's metadata without that policy
    (`_reload_with_readers_retry`).
    """
    from apache_beam.io.gcp import gcsio_retry
    gcsio_retry.DEFAULT_RETRY = gcsio_retry.DEFAULT_RETRY.with_timeout(deadline_s)
    gcsio_retry.DEFAULT_RETRY_WITH_THROTTLING_COUNTER = (
        gcsio_retry.DEFAULT_RETRY_WITH_THROTTLING_COUNTER.with_timeout(deadline_s))
    _reload_with_readers_retry()


def _reload_with_readers_retry() -> None:
    """Makes Beam's GCS reader reload its blob with the reader's own retry policy.

    Beam 2.77.0: ``gcsio.BeamBlobReader.__init__(blob, ..., retry=...)`` calls
    ``blob.reload()`` with no ``retry``, so google-cloud-storage 3.17.1's
    default applies (a 120 s deadline) whatever policy GcsIO passed. The
    wrapper binds the reader's policy to that blob's ``reload`` first.
    Applied once per process.
    """
    from apache_beam.io.gcp import gcsio
    reader = gcsio.BeamBlobReader
    if getattr(reader.__init__, "reloads_with_readers_retry", False):
        return
    original = reader.__init__

    @functools.wraps(original)
    def __init__(self, blob, *args, **kwargs):
        if "retry" in kwargs:
            blob.reload = functools.partial(blob.reload, retry=kwargs["retry"])
        original(self, blob, *args, **kwargs)

    __init__.reloads_with_readers_retry = True
    reader.__init__ = __init__


def gcs_retry():
    """Beam's GCS retry policy, with the deadline `set_gcs_retry_deadline` gave it.

    Beam 2.77.0: `apache_beam.io.gcp.gcsio_retry.DEFAULT_RETRY`.
    """
    from apache_beam.io.gcp import gcsio_retry
    return gcsio_retry.DEFAULT_RETRY


def gcs_bucket(name: str):
    """The google-cloud-storage bucket ``name``, through the client Beam's GCS I/O uses.

    Beam 2.77.0: ``GcsIO().client`` is a ``google.cloud.storage.Client``.
    """
    from apache_beam.io.gcp import gcsio
    return gcsio.GcsIO().client.bucket(name)


def skip_beam_credential_lookup() -> None:
    """Makes Beam's GCS client connect without credentials (for a local GCS API server).

    Beam 2.77.0: `apache_beam.internal.gcp.auth._Credentials` caches the
    looked-up credentials in ``_credentials``, guarded by
    ``_credentials_lock``, and looks them up (retrying for ~25 s when none
    exist) until ``_credentials_init`` is set.
    """
    from apache_beam.internal.gcp import auth
    with auth._Credentials._credentials_lock:  # pylint: disable=protected-access
        auth._Credentials._credentials = None  # pylint: disable=protected-access
        auth._Credentials._credentials_init = True  # pylint: disable=protected-access


def beam_argument_parser():
    """An empty argparse parser of the kind Beam fills with every option class.

    Beam 2.77.0: `PipelineOptions.get_all_options` parses with
    ``apache_beam.options.pipeline_options._BeamArgumentParser(allow_abbrev=False)``
    after each option class's ``_add_argparse_args``; this returns the same
    kind of parser, so a flag counts as known exactly when Beam would parse it.
    """
    from apache_beam.options import pipeline_options
    return pipeline_options._BeamArgumentParser(  # pylint: disable=protected-access
        allow_abbrev=False)


def add_option_class_arguments(parser, option_class) -> None:
    """Adds one option class's flags to ``parser``, as Beam does.

    Beam 2.77.0: each ``PipelineOptions`` subclass defines its flags in the
    classmethod ``_add_argparse_args(parser)``.
    """
    option_class._add_argparse_args(parser)  # pylint: disable=protected-access


def direct_runner_without_prism():
    """Beam's DirectRunner, kept on its in-process runners.

    Beam 2.77.0: ``DirectRunner`` is ``SwitchingDirectRunner``, whose
    ``run_pipeline`` first tries ``PrismRunner`` for any pipeline Prism
    supports; Prism downloads a Go binary from GitHub at run time, so offline
    the attempt fails and the runner falls back, and online the job runs on
    Prism instead of the FnApiRunner its local file shuffle, worker flags and
    tests assume. The Prism attempt is skipped when the runner's
    ``_is_interactive`` is set (what ``is_interactive()`` does), which is read
    by that check alone.
    """
    from apache_beam.runners.direct.direct_runner import SwitchingDirectRunner
    runner = SwitchingDirectRunner()
    runner.is_interactive()
    return runner


class _SysWithWorkerCommand:
    """`sys`, except ``executable``: what `worker_processes_ignore_stop_signals` sets."""

    def __init__(self, real, executable: str):
        self._real = real
        self.executable = executable

    def __getattr__(self, name: str):
        return getattr(self._real, name)


def worker_processes_ignore_stop_signals() -> None:
    """Starts the local runner's worker processes (``--direct_running_mode=
    multi_processing``) ignoring SIGINT, SIGTERM and SIGHUP.

    A terminal's Ctrl-C reaches the whole process group: workers that took it
    would print their own tracebacks; the job's driver stops them itself
    (`pipeline.stop`). Blocking the signals in the thread that spawns them
    does not reach them: dash, the ``/bin/sh`` that spawns them, unblocks
    every signal when it starts. An ignored signal stays ignored across
    ``exec``, and Python keeps SIGINT ignored when it starts that way.

    Beam 2.77.0: `FnApiRunner.run_pipeline` builds that mode's worker command
    as ``'%s -m apache_beam.runners.worker.sdk_worker_main' % sys.executable``,
    reading ``sys`` through its module, and runs it with ``shell=True``. That
    module's ``sys`` becomes a view of `sys` whose ``executable`` is ``trap ''
    INT TERM HUP; exec PYTHON``. (Its one other use of ``sys.executable``
    runs gprof2dot after ``--profile_cpu``, which the job does not use.)
    """
    import shlex
    import sys
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    if fn_runner.sys is sys:
        fn_runner.sys = _SysWithWorkerCommand(
            sys, f"trap '' INT TERM HUP; exec {shlex.quote(sys.executable)}")


# Modules Beam 2.77.0 imports, when installed, only for parts the job does not
# use, each under a ``try`` whose ``except`` takes ``ImportError``:
# - pandas and pyarrow: ``apache_beam/typehints/__init__.py``, the batch
#   converters of DataFrames and Arrow tables;
# - bson and pymongo: ``apache_beam/io/mongodbio.py``, MongoDB IO;
# - google.cloud.pubsub: ``apache_beam/io/gcp/pubsub.py``, Pub/Sub IO;
# - google.cloud.bigquery and google.cloud.bigquery_storage_v1:
#   ``apache_beam/io/gcp/bigquery_tools.py`` and ``bigquery.py``, BigQuery IO.
_OPTIONAL_FOR_BEAM = ("pandas", "pyarrow", "bson", "pymongo", "google.cloud.pubsub",
                      "google.cloud.bigquery", "google.cloud.bigquery_storage_v1")
# Beam 2.77.0 logs their absence: mongodbio a warning, bigquery.py a note.
_LOGGERS_OF_ABSENCE = ("apache_beam.io.mongodbio", "apache_beam.io.gcp.bigquery")


def _drop_record(record) -> bool:
    return False


def import_beam() -> None:
    """Imports Apache Beam without the optional modules it would import along.

    `_OPTIONAL_FOR_BEAM` lists them. On 2 cores they cost ~0.4-0.6 s of CPU
    (pandas and pyarrow ~0.3-0.5 s, the others ~0.2 s), against ~1.6 s for
    the job's whole start-up without them. So while Beam's first import
    runs, an absent entry in ``sys.modules`` makes each raise
    ``ImportError``, and the records Beam logs about their absence are
    dropped; afterwards all of them import as usual. Once Beam is imported
    this does nothing.
    """
    import logging
    import sys
    if "apache_beam" in sys.modules:
        return
    hidden = [name for name in _OPTIONAL_FOR_BEAM if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # `import name` raises ImportError
    loggers = [logging.getLogger(name) for name in _LOGGERS_OF_ABSENCE]
    for logger in loggers:
        logger.addFilter(_drop_record)
    try:
        import apache_beam  # noqa: F401
    finally:
        for logger in loggers:
            logger.removeFilter(_drop_record)
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
