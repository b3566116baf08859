"""The TPU VM launcher (``mnist-launch-tpu``); its modules: docs/launch.md,
"Code layout"."""
