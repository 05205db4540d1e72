"""Compiling the recorded specialisations with ``triton.compile``: cubins, PTX and metadata."""

from __future__ import annotations

import os
import re
from typing import Any

from onnxq.cast.aot_record import specialisations
from onnxq.cast.aot_spec import ARCHS, ROLE_IDS, GenerationError, KernelSpec

_PARAM_RE = re.compile(r"\.param\s+\.(\w+)")


def compile_spec(spec: KernelSpec, arch: int) -> dict[str, Any]:
    """Compile one specialisation for ``sm_<arch>``: cubin, PTX and launch metadata.

    Raises:
        GenerationError: the compiled kernel needs something the launcher does not provide.
    """
    os.environ.setdefault("TRITON_DISABLE_LINE_INFO", "1")  # smaller images
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget

    fn = getattr(importlib.import_module(spec.module), spec.kernel)
    target = GPUTarget("cuda", arch, 32)
    backend = triton.compiler.make_backend(target)
    options = backend.parse_options(dict(spec.options))
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in spec.hints}
    src = triton.compiler.ASTSource(
        fn=fn, signature=spec.signature, constexprs=spec.constexprs, attrs=attrs
    )
    ck = triton.compile(src, target=target, options=options.__dict__)
    md = ck.metadata
    for what in ("global_scratch_size", "profile_scratch_size", "tmem_size"):
        if getattr(md, what, 0):
            raise GenerationError(f"{spec.symbol}: the kernel needs {what} = {getattr(md, what)}")
    if getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_cooperative_grid", False):
        raise GenerationError(f"{spec.symbol}: clusters / cooperative launches are not supported")
    if getattr(md, "launch_pdl", False):
        raise GenerationError(f"{spec.symbol}: programmatic dependent launch is not supported")
    ptx = ck.asm["ptx"]
    entry = ptx[ptx.index(".entry") :]
    entry = entry[: entry.index(")")]
    params = _PARAM_RE.findall(entry)
    extra = params[len(spec.roles) :]
    if len(params) < len(spec.roles) or any(p not in ("u64", "b64") for p in extra):
        raise GenerationError(
            f"{spec.symbol}: the PTX entry has parameters {params} for {len(spec.roles)} arguments"
        )
    for (name, role, _), ptype in zip(spec.roles, params, strict=False):
        want = ("u32", "b32", "s32", "f32") if ROLE_IDS[role] >= 20 else ("u64", "b64")
        if ptype not in want:
            raise GenerationError(f"{spec.symbol}: parameter {name} is .{ptype} in the PTX")
    return {
        "cubin": ck.asm["cubin"],
        "ptx": ptx.encode() + b"\0",
        "name": md.name,
        "num_warps": md.num_warps,
        "shared": md.shared,
        "extra_params": len(extra),
    }


def _compile_job(job: tuple[str, int, tuple[str, ...]]) -> tuple[str, int, dict[str, Any]]:
    unit, arch, presets = job
    _, kernels, _ = _cached_specs(presets)
    spec = next(k for k in kernels if k.unit == unit)
    return unit, arch, compile_spec(spec, arch)


_SPEC_CACHE: dict[tuple[str, ...], Any] = {}


def _cached_specs(presets: tuple[str, ...]) -> Any:
    if presets not in _SPEC_CACHE:
        _SPEC_CACHE[presets] = specialisations(presets)
    return _SPEC_CACHE[presets]


def compile_all(
    presets: tuple[str, ...], units: list[str], jobs: int
) -> dict[tuple[str, int], Any]:
    """Every unit compiled for every architecture, in ``jobs`` processes (0: one per core)."""
    work = [(u, arch, presets) for u in units for arch in ARCHS]
    jobs = jobs or min(len(work), os.cpu_count() or 1)
    results: dict[tuple[str, int], dict[str, Any]] = {}
    if jobs > 1:
        import concurrent.futures
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            for unit, arch, res in pool.map(_compile_job, work):
                results[(unit, arch)] = res
    else:
        for job in work:
            unit, arch, res = _compile_job(job)
            results[(unit, arch)] = res
    return results
