"""The job's options as Beam sees them, and the check that Beam knows the rest.

The flags themselves are defined once, in `pipeline.flags`.
"""

from __future__ import annotations

from typing import Sequence

from apache_beam.options import pipeline_options as beam_options
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import flags

MB = flags.MB
# Runners that run in this process and hold their shuffle in memory.
LOCAL_RUNNERS = ("DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


class ConvertOptions(PipelineOptions):
    """``python -m pipeline --output=... [--source=...]`` plus any Beam option."""

    @classmethod
    def _add_argparse_args(cls, parser):
        flags.add_job_arguments(parser)

    def target_bytes(self) -> int:
        return flags.target_bytes(self)

    def shuffle_mode(self, runner: str | None) -> str:
        """``beam`` or ``files``: resolves ``--shuffle=auto`` for ``runner``.

        The local runners keep their shuffle in memory, so they get the
        flat-memory file shuffle; distributed runners shuffle better themselves.
        """
        if self.shuffle != "auto":
            return self.shuffle
        return "files" if (runner or "DirectRunner") in LOCAL_RUNNERS else "beam"


def unknown_flags(argv: Sequence[str], runner: str | None) -> list[str]:
    """The arguments that neither the job nor any Beam option class defines.

    Beam itself only logs "Discarding unparseable args" for them, so a
    misspelled flag would silently fall back to its default. The runner's own
    module is imported first, as running would, so its option classes count.
    """
    if runner:
        from apache_beam.runners.runner import create_runner
        create_runner(runner)
    # Beam's parser (allow_abbrev=False), filled exactly as
    # PipelineOptions.get_all_options fills it.
    parser = beam_options._BeamArgumentParser(  # pylint: disable=protected-access
        allow_abbrev=False)
    seen = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)  # pylint: disable=protected-access
    _, unknown = parser.parse_known_args(list(argv))
    return unknown
