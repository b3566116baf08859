"""Checks of `launch.tpu.topology`: host VMs per slice."""

import pytest

from launch.tpu import topology


@pytest.mark.parametrize("accelerator,hosts", [
    ("v2-8", 1), ("v3-32", 4), ("v4-8", 1), ("v4-32", 4), ("v4-128", 16),
    ("v5p-8", 1), ("v5p-16", 2), ("v5litepod-8", 1), ("v5litepod-16", 4),
    ("v5e-256", 64), ("v6e-8", 1), ("v6e-16", 4)])
def test_slice_hosts(accelerator, hosts):
    assert topology.slice_hosts(accelerator) == hosts
    assert topology.is_multi_host(accelerator) == (hosts > 1)
