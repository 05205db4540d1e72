"""The format language imports and parses without numpy (issue 2)."""

from __future__ import annotations

import subprocess
import sys


def test_the_format_language_imports_without_numpy() -> None:
    code = (
        "import sys; sys.modules['numpy'] = None\n"
        "import onnxq.formats as f\n"
        "import onnxq\n"
        "assert onnxq.datatype('mxfp4').bits_per_value == 4.25\n"
        "assert str(onnxq.number('cb41fi_e2m2fnuz')) == 'cb41fi_e2m2fnuz'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_cast_engine_is_reachable_from_the_top_package() -> None:
    import numpy as np

    import onnxq

    assert onnxq.cast(np.ones(4, np.float32), "mxfp4").tolist() == [1.0] * 4
    assert onnxq.bfp.quantize is not None
