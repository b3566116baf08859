"""The launchers: the conversion job on Dataflow and the trainer on a Cloud
TPU VM (docs/launch.md; its modules: "Code layout").

Standard library only, plus this project's `mnist_common`, `mnist_contract`,
`trainer.config` and `pipeline.options` (the flag parsers of the programs
they start), so a checkout's ``.venv`` with no extra runs them. Each runs as
its console script (``mnist-launch-dataflow``, ``mnist-launch-tpu``) or as
``python -m launch.dataflow``, ``python -m launch.tpu``."""
