"""The job's parts without the job: the error classifier, the shuffle choice,
and each composite transform run on small inputs with TestPipeline."""

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.errors import PipelineInputError, StorageError, as_pipeline_error
from pipeline.options import ConvertOptions


def _options(*flags):
    return PipelineOptions(list(flags)).view_as(ConvertOptions)


@pytest.mark.parametrize("runner, mode", [(None, "files"), ("DirectRunner", "files"),
                                          ("DataflowRunner", "beam"),
                                          ("DaskRunner", "beam")])
def test_auto_shuffle_is_files_only_for_local_runners(runner, mode):
    assert _options().shuffle_mode(runner) == mode


@pytest.mark.parametrize("chosen", ["beam", "files"])
def test_explicit_shuffle_wins(chosen):
    assert _options(f"--shuffle={chosen}").shuffle_mode("DirectRunner") == chosen
    assert _options(f"--shuffle={chosen}").shuffle_mode("DataflowRunner") == chosen


def test_classifier_finds_input_error_by_type_and_by_text():
    try:
        try:
            raise PipelineInputError("a.gz: wrong IDX magic\nmore detail")
        except PipelineInputError as inner:
            raise RuntimeError("worker failed") from inner
    except RuntimeError as outer:
        found = as_pipeline_error(outer, "out")
    assert isinstance(found, PipelineInputError) and str(found) == "a.gz: wrong IDX magic"
    text = RuntimeError("Traceback ...\npipeline.errors.PipelineInputError: b.gz: bad\nx")
    assert str(as_pipeline_error(text, "out")) == "b.gz: bad"


@pytest.mark.parametrize("error", [RuntimeError("RetryError('Timeout of 120.0s')"),
                                   ConnectionRefusedError("refused"),
                                   OSError("disk went away")])
def test_classifier_names_the_output_for_storage_failures(error):
    found = as_pipeline_error(error, "gs://b/out")
    assert isinstance(found, StorageError)
    assert str(found).startswith("gs://b/out: storage failed during the run")


def test_classifier_leaves_unknown_errors_alone():
    assert as_pipeline_error(ValueError("a bug"), "out") is None
