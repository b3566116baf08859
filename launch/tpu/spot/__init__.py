"""Spot runs of ``mnist-launch-tpu run``, through preemptions; its modules:
docs/launch.md, "Code layout"."""
