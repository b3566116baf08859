"""The fake TPU VM's host name for Python: each VM has its own, as on Cloud
TPU, so the trainer's model_dir lock tells a dead VM's hold from this one's
(`tests.launch.fake_cloud`)."""

import os
import socket

_HOST = os.environ.get("FAKE_TPU_HOSTNAME")
if _HOST:
    socket.gethostname = lambda: _HOST
