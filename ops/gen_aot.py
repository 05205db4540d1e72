"""Build step of ops/CMakeLists.txt: compile the Triton kernels ahead of time (onnxq/cast/aot.py).

Usage: python ops/gen_aot.py OUT_DIR. Exit status 0: OUT_DIR holds aot_index.inc, kernels.bin and
manifest.json; 3: torch or triton does not import (the library is built without GPU kernels);
anything else: the generation failed (the message says why; the library is built without them).
The source tree's onnxq is imported, whatever is installed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _main() -> int:
    try:
        import torch  # noqa: F401
        import triton  # noqa: F401
    except ImportError as err:
        print(f"onnxq: no GPU kernels: {err}", file=sys.stderr)
        return 3
    from onnxq.cast import aot

    return aot.main(sys.argv[1:])


if __name__ == "__main__":  # the compile workers (spawned) import this file again
    sys.exit(_main())
