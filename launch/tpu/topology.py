"""Cloud TPU slices: the accelerator types the launcher knows, how many host
VMs a slice has, and the plain OS image a one-host slice starts from."""

from __future__ import annotations

import math
import re

from launch.errors import ConfigError

# Accelerator family -> plain OS image for the TPU VM (JAX/PyTorch images in
# Google's runtime table; TensorFlow is installed on top with pip).
BASE_IMAGES = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5p": "v2-alpha-tpuv5",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5e": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}
_ACCELERATOR_RE = re.compile(r"^(?P<family>[a-z0-9]+)-(?P<size>\d+)$")
# Above this size (TensorCores for v2-v5p, chips for v5e/v6e) a slice spans
# more than one host VM.
_ONE_HOST_MAX = 8
# Size units per host VM on multi-host slices, each VM one input pipeline.
# v2-v5p sizes count TensorCores: 4 chips of 2 per VM (cloud.google.com/tpu/
# docs/v5p, "Configurations": v5p-16 has 2 hosts, v5p-128 16; v4 likewise,
# /tpu/docs/v4). v5e and v6e sizes count chips, and their multi-host slices
# are made of 4-chip VMs (/tpu/docs/v5e and /tpu/docs/v6e, "VM types").
_SIZE_PER_HOST = {"v2": 8, "v3": 8, "v4": 8, "v5p": 8,
                  "v5litepod": 4, "v5e": 4, "v6e": 4}
# A family's everyday name -> the TPU API's: the API (and gcloud) names v5e
# slices v5litepod-N and refuses v5e-N.
API_FAMILIES = {"v5e": "v5litepod"}


def parse_accelerator(accelerator_type: str) -> tuple[str, int]:
    match = _ACCELERATOR_RE.match(accelerator_type)
    if not match or match["family"] not in BASE_IMAGES:
        raise ConfigError(
            f"--accelerator_type {accelerator_type!r} is not one of "
            f"{', '.join(f + '-N' for f in BASE_IMAGES)} (e.g. v4-8, "
            "v5litepod-8, v6e-8)")
    return match["family"], int(match["size"])


def api_accelerator(accelerator_type: str) -> str:
    """``accelerator_type`` as the TPU API names it (v5e-8: v5litepod-8)."""
    family, size = parse_accelerator(accelerator_type)
    if family not in API_FAMILIES:
        return accelerator_type
    return f"{API_FAMILIES[family]}-{size}"


def slice_hosts(accelerator_type: str) -> int:
    """Host VMs in a slice of ``accelerator_type`` (e.g. v4-32: 4)."""
    family, size = parse_accelerator(accelerator_type)
    if size <= _ONE_HOST_MAX:
        return 1
    return math.ceil(size / _SIZE_PER_HOST[family])


def is_multi_host(accelerator_type: str) -> bool:
    return slice_hosts(accelerator_type) > 1



def default_runtime_version(accelerator_type: str) -> str:
    family, _ = parse_accelerator(accelerator_type)
    if is_multi_host(accelerator_type):
        raise ConfigError(
            f"{accelerator_type} spans several hosts: pass "
            "--runtime_version=tpu-vm-tf-<version>-pod-pjrt (a TensorFlow pod "
            "image; list them with `gcloud compute tpus tpu-vm versions list`)")
    return BASE_IMAGES[family]
