"""A TPU VM launch's settings (`TpuConfig`), settled once by
`launch.tpu.cli.resolve_config`, and their defaults."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from launch import staging
from launch import wheel as lw

DEFAULT_TENSORFLOW = "tensorflow-tpu==2.20.0"
# The newest libtpu that tensorflow-tpu 2.20.0 loads (docs/tpu_vm_stack.md
# has the versions tried); the build itself accepts any libtpu~=0.0.14.
DEFAULT_LIBTPU = "libtpu==0.0.31"
DEFAULT_DIST_DIR = lw.REPO_ROOT / "dist" / "tpu_vm"


@dataclasses.dataclass(frozen=True)
class TpuConfig:
    """A launch's settings, settled once (`launch.tpu.cli.resolve_config`)."""
    name: str
    zone: str
    project: str | None = None
    accelerator_type: str | None = None
    runtime_version: str | None = None
    multi_host: bool = False
    tensorflow: str = DEFAULT_TENSORFLOW
    libtpu: str | None = None
    spot: bool = False
    queued: bool = False
    data: str | None = None
    model_dir: str | None = None
    trainer_args: tuple[str, ...] = ()
    delete_after: bool = False
    poll_seconds: float = 60.0
    wait_timeout: float = 86400.0
    lines: int = 100
    follow: bool = False
    gcloud: str = "gcloud"
    python: str = sys.executable
    dist_dir: Path = DEFAULT_DIST_DIR
    build_isolation: bool = True
    # Where the wheel ``setup`` copies comes from (`launch.staging`).
    wheel_source: staging.Source = dataclasses.field(default_factory=staging.find_source)
    # ``run`` only (launch/tpu/spot/runner.py).
    max_recoveries: int = 5
    keep: bool = False
    events: Path | None = None
    logs_dir: Path = Path(".")
    retry_seconds: float = 900.0
    # The mark (`MARK_KEY`) of the VM this launch creates or works on.
    run_id: str | None = None
