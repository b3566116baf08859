"""``python -m pipeline --output=... [--source=...] [Beam options]``."""

import logging
import sys

from pipeline.errors import PipelineInputError


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    from pipeline import job
    try:
        manifest = job.run(sys.argv[1:] if argv is None else argv)
    except PipelineInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, split in sorted(manifest.splits.items()):
        print(f"{name}: {split.num_examples} examples in {len(split.shards)} shard(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
