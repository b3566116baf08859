"""The one exception the job raises for problems a user can fix."""


class PipelineInputError(Exception):
    """Bad input or output location. The message names the file and the problem.

    `python -m pipeline` prints it as one line and exits non-zero; raised
    inside a Beam worker, it carries the same message out of the runner.
    """
