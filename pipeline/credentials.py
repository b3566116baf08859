"""Google credentials, checked before any gs:// or Dataflow work starts.

Without credentials Beam's GCS client retries for minutes and then reports the
output as unwritable. This check answers within seconds and names the fix.
It imports neither Beam nor TensorFlow, so the command line runs it first.
"""

from __future__ import annotations

import logging
import os
import threading

from pipeline.errors import MissingCredentials

# On a GCE or Dataflow VM the metadata server is the credential source and
# answers google.auth's ping in milliseconds; elsewhere the ping may take 3
# tries of 3 s. The lookup gets this long before the job gives up.
WAIT_S = 8.0
FIX = ("run `gcloud auth application-default login`, or set "
       "GOOGLE_APPLICATION_CREDENTIALS to a service account key file")


def needs_google(paths, runner: str | None) -> str | None:
    """What needs Google credentials (the first gs:// path, or the runner), if anything."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return None  # a local GCS API server takes no credentials
    remote = [p for p in paths if p and str(p).startswith("gs://")]
    if remote:
        return remote[0]
    if runner and "dataflow" in runner.lower():
        return f"--runner={runner}"
    return None


def require(paths, runner: str | None) -> None:
    """Raises a one-line MissingCredentials if ``paths`` or ``runner`` need
    credentials none provide."""
    what = needs_google(paths, runner)
    if what:
        check(what)


def check(what: str, wait_s: float = WAIT_S) -> None:
    """Raises a one-line MissingCredentials naming the fix if no credentials are found."""
    found: dict = {}

    def look_up():
        try:
            import google.auth
            found["credentials"] = google.auth.default()
        except Exception as e:  # any failure here means: no usable credentials
            found["error"] = e

    auth_logger = logging.getLogger("google.auth")
    level = auth_logger.level
    auth_logger.setLevel(logging.ERROR)  # its own warnings would add lines
    try:
        lookup = threading.Thread(target=look_up, name="credentials", daemon=True)
        lookup.start()
        lookup.join(wait_s)
    finally:
        auth_logger.setLevel(level)
    if "credentials" in found:
        return
    error = found.get("error")
    if error is None:
        reason = f"none found within {wait_s:g} s"
    elif type(error).__name__ == "DefaultCredentialsError" and "not found" in str(error):
        reason = "none found"
    else:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    raise MissingCredentials(f"{what}: no Google credentials ({reason}); {FIX}")
