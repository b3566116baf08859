"""The error classifier (`pipeline.errors.as_pipeline_error`): one-line errors
out of whatever a runner raised."""

import pytest

from pipeline.errors import PipelineInputError, StorageError, as_pipeline_error


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
