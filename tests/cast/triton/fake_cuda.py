"""The C library's CUDA path run on the CPU: `fake_libcuda.c` as the driver, Triton's
interpreter as the GPU.

`Emulator` loads the fake driver (which the library then loads too, through ``ONNXQ_LIBCUDA``:
the same handle), registers numpy buffers as device memory, and answers each ``cuLaunchKernel``
by finding the launched image among the build's (``ops/build/aot``: the sm_90 cubin's bytes),
reading the parameter slots as the image's signature says and running the kernel it was
compiled from in the interpreter, with the compiled constexprs. Only the images' machine code is
left out: the launcher's choices, parameters, grids, scratch, table uploads and launch order are
the library's own. Use it in a process started with ``TRITON_INTERPRET=1`` and
``ONNXQ_LIBCUDA`` set to the built fake (`build`), before the library's first CUDA call.
"""

from __future__ import annotations

import ctypes
import importlib
import shutil
import subprocess
import traceback
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
_TORCH_TYPES = {
    "u8": "uint8",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "fp64": "float64",
}
_LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.c_uint64,
    ctypes.c_char_p,
    ctypes.c_uint,
    ctypes.POINTER(ctypes.c_void_p),
)


def build(out_dir: Path) -> Path | None:
    """Compile fake_libcuda.c into ``out_dir``; None without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    so = Path(out_dir) / "libfakecuda.so"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", str(so), str(HERE / "fake_libcuda.c")],
        check=True,
        capture_output=True,
    )
    return so


def build_allocator(out_dir: Path, include: Path) -> Path:
    """Compile fake_ort_allocator.c against onnxruntime's C API headers in ``include``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    so = Path(out_dir) / "libfakeortalloc.so"
    src = HERE / "fake_ort_allocator.c"
    cmd = [str(cc), "-shared", "-fPIC", "-O1", "-Wall", f"-I{include}", "-o", str(so), str(src)]
    subprocess.run([*cmd, "-ldl"], check=True, capture_output=True)
    return so


class Emulator:
    """The fake driver's launch callback: each launch replayed in Triton's interpreter."""

    def __init__(self, fake: Path, manifest: dict[str, Any], blob: bytes) -> None:
        self.lib = ctypes.CDLL(str(fake))
        self.lib.fake_find.argtypes = [
            ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint64),
        ]
        self.lib.fake_register.argtypes = [ctypes.c_uint64, ctypes.c_uint64]
        self.images: dict[bytes, dict[str, Any]] = {}
        for k in manifest["kernels"]:
            off, size = k["cubin"]["sm_90"]
            self.images.setdefault(bytes(blob[off : off + size]), k)
        self.log: list[str] = []  # the symbol of each launch, in order
        self.errors: list[str] = []
        self._callback = _LAUNCH(self._launch)
        self.lib.fake_set_launch(self._callback)
        self._kept: list[np.ndarray] = []

    def device(self, a: np.ndarray) -> int:
        """Register a contiguous array as device memory; its address."""
        assert a.flags.c_contiguous
        self._kept.append(a)
        addr = a.ctypes.data
        assert self.lib.fake_register(addr, max(a.nbytes, 1)) == 0
        return addr

    def _tensor(self, addr: int, ptype: str) -> Any:
        import torch

        dtype = getattr(torch, _TORCH_TYPES[ptype])
        if addr == 0:  # null: a feature the image has off, never touched
            return torch.zeros(1, dtype=dtype)
        base, size = ctypes.c_uint64(), ctypes.c_uint64()
        if not self.lib.fake_find(addr, ctypes.byref(base), ctypes.byref(size)):
            raise ValueError(f"kernel argument {addr:#x} is not device memory")
        n = base.value + size.value - addr
        n -= n % dtype.itemsize
        raw = (ctypes.c_uint8 * n).from_address(addr)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype)

    def _launch(self, image: int, size: int, name: bytes, grid: int, params: Any) -> int:
        try:
            k = self.images.get(ctypes.string_at(image, size))
            if k is None:
                raise ValueError(f"launched image of {size} bytes is not in the build's")
            fn = getattr(importlib.import_module(k["module"]), k["kernel"])
            if name.decode() != k["kernel"]:
                raise ValueError(f"entry {name!r} in an image of {k['kernel']}")
            kw = dict(k["constexprs"])
            if kw.get("HW_BF16"):
                kw["HW_BF16"] = False  # the interpreter needs the bit arithmetic's bfloat16
            for i, (pname, _role, _extra) in enumerate(k["roles"]):
                sig = k["signature"][pname]
                slot = params[i]
                if sig.startswith("*"):
                    kw[pname] = self._tensor(ctypes.c_uint64.from_address(slot).value, sig[1:])
                elif sig == "i32":
                    kw[pname] = ctypes.c_int32.from_address(slot).value
                elif sig == "fp32":
                    kw[pname] = ctypes.c_float.from_address(slot).value
                else:
                    raise ValueError(f"parameter {pname} of type {sig}")
            fn[(grid,)](**kw)
            self.log.append(k["symbol"])
            return 0
        except Exception:  # reported by the test; the library sees a failed launch
            self.errors.append(traceback.format_exc())
            return 999
