"""The data contract between the conversion job (`pipeline`) and the trainer.

A neutral package: both sides import it, neither imports the other. What
an output folder holds and what each record is: docs/pipeline.md, "Output
layout". This module re-exports the standard-library-only parts: `spec`
(the feature spec and file naming), `manifest` (``manifest.json``) and
`sizes` (a record's bytes). `examples` (the Example codec, needs
TensorFlow), `wire` (Example bytes without TensorFlow) and `framing`
(TFRecord framing, needs google-crc32c) are imported by name where they
are needed.
"""

from mnist_contract.manifest import Manifest, ShardInfo, SplitInfo  # noqa: F401
from mnist_contract.sizes import RECORD_SIZES, max_plausible_examples  # noqa: F401
from mnist_contract.spec import *  # noqa: F401,F403
from mnist_contract.spec import ContractError  # noqa: F401
