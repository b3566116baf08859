"""The launchers: the conversion job on Dataflow and the trainer on a Cloud
TPU VM (docs/launch.md; its modules: "Code layout").

Standard library only, plus this project's `mnist_common`, `mnist_contract`
and `trainer.config`, so a checkout's ``.venv`` with no extra runs them."""
