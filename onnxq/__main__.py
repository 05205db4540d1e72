"""``python -m onnxq``: the ``onnxq`` command (see `onnxq.cli`)."""

import sys

from onnxq.cli import main

if __name__ == "__main__":
    sys.exit(main())
