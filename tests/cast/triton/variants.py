"""pytest plugin: count the Triton compiles a test run would trigger on a GPU.

    python -m pytest -p tests.cast.triton.variants tests/cast/triton/test_engine.py
    TRITON_VARIANTS=dry python -m pytest -p tests.cast.triton.variants \
        tests/cast/triton/test_engine.py

Every launch in Triton's interpreter is keyed as the GPU cache keys it: the constexpr values,
pointer dtypes, and for runtime ints Triton's specialisation (== 1, divisible by 16, i32/i64)
unless the kernel lists them in ``do_not_specialize``. The distinct keys per kernel are
printed at the end (and written to ``$TRITON_VARIANTS_OUT`` as JSON).

``TRITON_VARIANTS=dry`` emulates a GPU run: the tests see ``torch.cuda.is_available()`` and
take their GPU shapes, kernels are not executed and comparisons are skipped (results are
garbage; only the keys count), and the hosts' interpreter-only block shrinking is off.
"""

from __future__ import annotations

import collections
import inspect
import json
import os
import sys

import pytest

DRY = os.environ.get("TRITON_VARIANTS") == "dry"
KEYS: dict[str, set] = collections.defaultdict(set)


def _spec(value, nospec: bool):
    if hasattr(value, "dtype") and hasattr(value, "data_ptr"):
        return str(value.dtype)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        width = "i32" if -(2**31) <= value < 2**31 else "i64"
        return width if nospec else (width, value == 1, value % 16 == 0)
    if isinstance(value, float):
        return "fp32"
    return repr(value)


def pytest_configure(config) -> None:
    os.environ["TRITON_INTERPRET"] = "1"
    if DRY:
        import torch

        torch.cuda.is_available = lambda: True
    from triton.runtime import interpreter

    run = interpreter.InterpretedFunction.run

    def recording_run(self, *args, grid, warmup, **kwargs):
        sig = inspect.signature(self.fn)
        bound = dict(zip(sig.parameters, args, strict=False)) | kwargs
        nospec = set(self.kwargs.get("do_not_specialize") or ())
        key = []
        for name, param in sig.parameters.items():
            value = bound.get(name, param.default)
            if "constexpr" in str(param.annotation):
                key.append((name, repr(value)))
            else:
                key.append((name, _spec(value, name in nospec)))
        KEYS[self.fn.__name__].add(tuple(key))
        if DRY:
            return None
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    interpreter.InterpretedFunction.run = recording_run


def pytest_collection_modifyitems(session, config, items) -> None:
    if not DRY:
        return
    for name, module in list(sys.modules.items()):
        # the Triton engine tests and their support module (tests/cast/triton/), not cuda_aot's
        last = name.rsplit(".", 1)[-1]
        engine_test = last.startswith("test_") and last != "test_cuda_aot"
        if name.startswith("tests.cast.triton.") and (engine_test or last == "support"):
            module.DEV = "cpu"
            for check in ("assert_same", "assert_same_qtensor"):
                if hasattr(module, check):
                    setattr(module, check, lambda *a, **k: None)
    engine = sys.modules.get("onnxq.cast.triton")
    if engine is not None and hasattr(engine, "_interpreting"):
        engine._interpreting = lambda: False


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus) -> None:
    counts = {name: len(keys) for name, keys in sorted(KEYS.items())}
    print(f"\nTriton compiles: {counts}, {sum(counts.values())} in all")
    out = os.environ.get("TRITON_VARIANTS_OUT")
    if out:
        with open(out, "w") as f:
            json.dump(counts, f, indent=1)
