"""Bandwidth of the Triton cast engine on a GPU (issue 5, item 4).

For 8192x8192 and 16384x16384 bfloat16 / float32 tensors and each format, the achieved
bandwidth (bytes read + bytes written, per second) of

- ``virtual``: ``onnxq.cast(x, fmt, backend="triton")`` (read x, write a tensor like x);
- ``compress``: ``onnxq.cast(x, fmt, mode="compress", backend="triton")`` (read x, write the
  packed codes, scales and meta bits);

next to a device-to-device copy of the input (``torch.Tensor.copy_``, read + write), and,
where ``torchao`` is importable, torchao's MX casts: ``MXTensor.to_mx`` (MXFP8/MXFP4) and its
Triton kernel ``triton_to_mxfp8_dim0`` (bfloat16 MXFP8, floor scales, rows).
Target: 80% of the copy's bandwidth, and at least torchao's speed.

Each figure is timed twice: ``call`` is ``onnxq.cast`` as a Python user calls it (CUDA events
around back-to-back calls, host overhead included where it exceeds the GPU time), ``kernel``
is the same call captured once in a CUDA graph and replayed (GPU time only).

Usage: ``PYTHONPATH=. python benchmarks/gpu.py --json OUT.json [--budget SECONDS]``;
``--sweep`` first times a few program sizes of the fast path and uses the best, then the
packing layouts of sub-byte compress casts (``ONNXQ_TRITON_PACK_GROUP``) and the codebook
kernel's program sizes (``ONNXQ_TRITON_CB_CONFIG``), 8192^2 kernels.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
import traceback
from typing import Any

import torch

FORMATS = ["mxfp8e4", "mxfp6e2", "mxfp4", "mxint8", "bfp16", "mx6", "nvfp4"]
FORMATS += ["cb41fi_e2m2fnuz_e8m0_t32"]  # a codebook
CASES = [
    ((8192, 8192), torch.bfloat16, FORMATS),
    ((8192, 8192), torch.float32, FORMATS),
    ((16384, 16384), torch.bfloat16, FORMATS),
    ((16384, 16384), torch.float32, FORMATS),
]


def bench(fn: Any, iters: int = 10, warmup: int = 2) -> float:
    """Median milliseconds of ``fn()`` with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def bench_graph(fn: Any, iters: int = 10) -> float:
    """Median milliseconds of one replay of ``fn`` captured in a CUDA graph (GPU time only)."""
    fn()  # compile and allocate outside the capture
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return bench(graph.replay, iters)


def qbytes(q: Any) -> int:
    fields = (q.data, q.scale, q.zero, q.tenscale, q.meta, q.mask)
    return sum(f.numel() * f.element_size() for f in fields if f is not None)


def torchao_casts() -> dict[str, Any]:
    """torchao's MX casts that import here: {label: (formats, dtypes, fn(x, fmt))}."""
    found: dict[str, Any] = {}
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor

        try:
            from torchao.prototype.mx_formats.constants import DTYPE_FP4
        except Exception:
            DTYPE_FP4 = getattr(torch, "float4_e2m1fn_x2", None)
        elems = {"mxfp8e4": torch.float8_e4m3fn, "mxfp4": DTYPE_FP4}
        found["to_mx"] = (
            {k for k, v in elems.items() if v is not None},
            {torch.bfloat16, torch.float32},
            lambda x, fmt: MXTensor.to_mx(x, elems[fmt], 32),
        )
    except Exception as err:  # any import problem means "absent"
        print(f"torchao MXTensor: {err}")
    try:
        # torchao defines these kernels only on sm_100+ with CUDA >= 12.8 (its module's
        # `_triton_kernels_available`); elsewhere they raise "needs triton" when called
        from torchao.prototype.mx_formats import kernels

        triton_to_mxfp8_dim0 = kernels.triton_to_mxfp8_dim0
        found["triton_to_mxfp8_dim0"] = (
            {"mxfp8e4"},
            {torch.bfloat16},
            lambda x, fmt: triton_to_mxfp8_dim0(x, 32, "floor"),
        )
    except Exception as err:
        print(f"torchao triton_to_mxfp8_dim0: {err}")
    return found


def sweep(iters: int) -> str | None:
    """Time the fast path's program sizes on two casts; set and return the best."""
    import os

    from onnxq.cast.api import cast

    x = torch.randn((8192, 8192), dtype=torch.bfloat16, device="cuda")
    best = None
    for cfg in ("2048:4", "4096:4", "4096:8", "8192:8", "8192:16", "16384:16"):
        os.environ["ONNXQ_TRITON_FAST_CONFIG"] = cfg
        try:
            ms = bench_graph(lambda: cast(x, "mxfp8e4", backend="triton"), iters)
            ms += bench_graph(lambda: cast(x, "mxfp4", mode="compress", backend="triton"), iters)
        except Exception as err:
            print(f"sweep {cfg}: {err}")
            continue
        print(f"sweep {cfg}: {ms:.3f} ms (mxfp8e4 virtual + mxfp4 compress, bf16 8192^2)")
        if best is None or ms < best[1]:
            best = (cfg, ms)
    if best is None:
        os.environ.pop("ONNXQ_TRITON_FAST_CONFIG", None)
        return None
    os.environ["ONNXQ_TRITON_FAST_CONFIG"] = best[0]
    return best[0]


def copy_time(x: torch.Tensor, iters: int) -> float:
    """Milliseconds of a device copy of ``x`` (read + write)."""
    buf = torch.empty_like(x)
    return bench(lambda: buf.copy_(x), iters)


def kernel_fraction(x: torch.Tensor, fmt: str, mode: str, copy_ms: float, iters: int) -> float:
    """One cast's kernels (a CUDA graph's replay) as a fraction of the copy's bandwidth."""
    from onnxq.cast.api import cast

    nbytes = x.numel() * x.element_size()
    q = cast(x, fmt, mode=mode, backend="triton")
    out_bytes = nbytes if mode == "virtual" else qbytes(q)
    del q
    ms = bench_graph(lambda: cast(x, fmt, mode=mode, backend="triton"), iters)
    return (nbytes + out_bytes) / ms / (2 * nbytes / copy_ms)


PACK_LAYOUTS = ("default", "flat", "3d", "load", "16")


def _pack_key(fmt: str, itemsize: int) -> tuple[int, int]:
    """The (G3, group) the current ``ONNXQ_TRITON_PACK_GROUP`` gives ``fmt``."""
    from onnxq.cast import triton_fast
    from onnxq.formats.datatype import datatype

    dt = datatype(fmt)
    assert dt.sspec is not None
    tile = dt.sspec.tiles[0].size
    return triton_fast._pack_layout(dt.nspec.bits, tile, not dt.sspec.scale.is_exponent, itemsize)


def knob_sweep(knob: str, settings: tuple[str, ...], measure: Any) -> dict[str, Any]:
    """``measure()`` under each setting of an environment knob ("default": unset); a failure
    is recorded as ``<setting>_error`` and the sweep goes on. The knob is unset afterwards."""
    import os

    row: dict[str, Any] = {}
    for setting in settings:
        if setting == "default":
            os.environ.pop(knob, None)
        else:
            os.environ[knob] = setting
        try:
            row[setting] = measure()
        except Exception as err:
            row[f"{setting}_error"] = str(err)[:200]
    os.environ.pop(knob, None)
    return row


def pack_layouts(iters: int) -> list[dict[str, Any]]:
    """Compress kernels (CUDA graphs, 8192^2) of the sub-byte formats in every packing layout
    (``ONNXQ_TRITON_PACK_GROUP``), as fractions of a copy; the default is left unchanged."""
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn((8192, 8192), dtype=dtype, device="cuda")
        copy_ms = copy_time(x, iters)
        for fmt in ("mxfp6e2", "mxfp4", "mx6", "nvfp4"):
            timed: dict[tuple[int, int], float] = {}  # layouts giving one kernel: timed once

            def measure(x: Any = x, fmt: str = fmt, timed: dict = timed, c: float = copy_ms):
                key = _pack_key(fmt, x.element_size())
                if key not in timed:
                    timed[key] = kernel_fraction(x, fmt, "compress", c, iters)
                return timed[key]

            row = knob_sweep("ONNXQ_TRITON_PACK_GROUP", PACK_LAYOUTS, measure)
            row.update(format=fmt, dtype=str(dtype).split(".")[-1])
            print(f"packing layouts: {json.dumps(row)}", flush=True)
            rows.append(row)
        del x
        torch.cuda.empty_cache()
    return rows


CB_CONFIGS = ("default", "256:4", "256:2", "1024:8", "128:1")  # the default is 512:4


def codebook_configs(iters: int) -> list[dict[str, Any]]:
    """The codebook kernel (8192^2, CUDA graphs) at a few program sizes and warp counts
    (``ONNXQ_TRITON_CB_CONFIG``), as fractions of a copy. ptxas for sm_90 gives 512:4 142
    registers a thread (3 programs, 12 warps an SM), 256:4 64 with 24 bytes spilled."""
    fmt = "cb41fi_e2m2fnuz_e8m0_t32"
    rows = []
    for dtype, modes in ((torch.bfloat16, ("virtual", "compress")), (torch.float32, ("virtual",))):
        x = torch.randn((8192, 8192), dtype=dtype, device="cuda")
        copy_ms = copy_time(x, iters)
        for mode in modes:
            row = knob_sweep(
                "ONNXQ_TRITON_CB_CONFIG",
                CB_CONFIGS,
                lambda x=x, mode=mode, c=copy_ms: kernel_fraction(x, fmt, mode, c, iters),
            )
            row.update(dtype=str(dtype).split(".")[-1], mode=mode)
            print(f"codebook configs: {json.dumps(row)}", flush=True)
            rows.append(row)
        del x
        torch.cuda.empty_cache()
    return rows


def c_library_path(iters: int) -> list[dict[str, Any]]:
    """The C library's CUDA path (ahead-of-time kernels, `onnxq.cast.cuda_aot`): packed
    quantize with the fast kernels, with the general ones (``ONNXQ_CUDA_FAST=0``), and the
    same elements as NCHW [64, 1024, 32, 32] tiled along the channels: packed (the general
    kernels' LAST=False compile) and values alone (QuantizeDequantizeMX's cast: the fast
    kernel's INNER compile)."""
    import os

    try:
        from onnxq.cast import cuda_aot

        ok, why = cuda_aot.available()
    except Exception as err:  # the library or its kernels are absent
        ok, why = False, str(err)
    if not ok:
        print(f"C library CUDA path: {why}")
        return []
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn((8192, 8192), dtype=dtype, device="cuda")
        nbytes = x.numel() * x.element_size()
        buf = torch.empty_like(x)
        copy_ms = bench(lambda x=x, buf=buf: buf.copy_(x), iters)
        for fmt in ("mxfp8e4", "mxfp4", "mx9", "mx6", "nvfp4"):
            row: dict[str, Any] = {"format": fmt, "dtype": str(dtype).split(".")[-1]}
            for label, fast in (("fast", "1"), ("general", "0")):
                os.environ["ONNXQ_CUDA_FAST"] = fast
                try:
                    out = cuda_aot.quantize_packed(x, fmt)
                    out_bytes = sum(t.numel() * t.element_size() for t in out.values())
                    ms = bench(lambda x=x, f=fmt: cuda_aot.quantize_packed(x, f), iters)
                    row[f"{label}_frac_copy"] = (nbytes + out_bytes) / ms / (2 * nbytes / copy_ms)
                except Exception as err:
                    row[f"{label}_error"] = str(err)[:200]
            os.environ.pop("ONNXQ_CUDA_FAST", None)
            # the same fast call's kernels alone (a CUDA graph's replay: the launcher queues
            # everything on the current stream, stream-ordered scratch included), as the
            # Triton table's "kernel" column; the calls above include the host's time
            try:
                out = cuda_aot.quantize_packed(x, fmt)
                out_bytes = sum(t.numel() * t.element_size() for t in out.values())
                ms = bench_graph(lambda x=x, f=fmt: cuda_aot.quantize_packed(x, f), iters)
                row["graph_frac_copy"] = (nbytes + out_bytes) / ms / (2 * nbytes / copy_ms)
            except Exception as err:
                row["graph_error"] = str(err)[:200]
            nchw = x.view(64, 1024, 32, 32)
            try:
                out = cuda_aot.quantize_packed(nchw, fmt, axis=1)
                out_bytes = sum(t.numel() * t.element_size() for t in out.values())
                ms = bench(lambda x=nchw, f=fmt: cuda_aot.quantize_packed(x, f, axis=1), iters)
                row["channels_frac_copy"] = (nbytes + out_bytes) / ms / (2 * nbytes / copy_ms)
            except Exception as err:
                row["channels_error"] = str(err)[:200]
            try:
                cuda_aot.quantize(nchw, fmt, axis=1, want_codes=False)
                ms = bench(
                    lambda x=nchw, f=fmt: cuda_aot.quantize(x, f, axis=1, want_codes=False), iters
                )
                row["channels_values_frac_copy"] = copy_ms / ms  # reads and writes a copy's
            except Exception as err:
                row["channels_values_error"] = str(err)[:200]
            print(f"C library CUDA path: {json.dumps(row)}", flush=True)
            rows.append(row)
    return rows


# CodebookLookup through the C library (its format-general decode blocks; docs/gpu.md)
LOOKUP_CODEBOOKS = ("cb41fi_e2m2fnuz_e8m0_t32", "cb42feie_e2m2fnuz_e8m0_t32s8")


def _random_packed(code: str, n: int) -> tuple[Any, Any, Any]:
    """Random packed CodebookLookup inputs for ``n`` elements: Q, Scale (2^-17 .. 2^12), Meta."""
    from onnxq.formats.datatype import datatype

    dt = datatype(code)
    book, tile = dt.nspec, dt.sspec.tiles[0]
    gen = torch.Generator(device="cuda").manual_seed(0)
    rand = functools.partial(torch.randint, dtype=torch.uint8, device="cuda", generator=gen)
    q = rand(0, 256, (n * book.index_bits // 8,))
    scale = rand(110, 140, (n // tile.size,))
    units = n // (tile.subtile or tile.size)
    meta = rand(0, 256, (-(-units * book.meta_bits // 8),)) if book.meta_bits else None
    return q, scale, meta


def c_library_lookup(iters: int) -> list[dict[str, Any]]:
    """CodebookLookup's decode on the C library's CUDA path (`cuda_aot.lookup_packed`), 8192^2.

    The packed inputs are random bytes of the right sizes (every byte a valid index, meta or
    scale code): the decode's work does not depend on the values, and a reference cast of 2^26
    elements would take minutes.
    """
    try:
        from onnxq.cast import cuda_aot

        ok, why = cuda_aot.available()
    except Exception as err:
        ok, why = False, str(err)
    if not ok:
        print(f"C library CUDA lookup: {why}")
        return []
    shape = (8192, 8192)
    rows = []
    for code in LOOKUP_CODEBOOKS:
        q, scale, meta = _random_packed(code, shape[0] * shape[1])
        in_bytes = sum(t.numel() for t in (q, scale, meta) if t is not None)
        for dtype in (torch.bfloat16, torch.float32):
            row: dict[str, Any] = {"format": code, "dtype": str(dtype).split(".")[-1]}
            try:
                y = torch.empty(shape, dtype=dtype, device="cuda")
                out_bytes = y.numel() * y.element_size()
                copy_ms = bench(y.clone, iters)
                decode = functools.partial(
                    cuda_aot.lookup_packed, code, shape, q, scale, meta, out_dtype=dtype
                )
                ms = bench(decode, iters)
                row["frac_copy"] = (in_bytes + out_bytes) / ms / (2 * out_bytes / copy_ms)
                row["ms"] = ms
            except Exception as err:
                row["error"] = str(err)[:200]
            print(f"C library CUDA lookup: {json.dumps(row)}", flush=True)
            rows.append(row)
    return rows


def c_library_gather(iters: int) -> list[dict[str, Any]]:
    """GatherMX's launch path (`cuda_aot.gather_packed`) on an mxfp4 table of MiniLM's shape
    (30522 x 384): 512 and 8192 rows, against torch's embedding lookup of the float table (the
    float model's Gather). Random codes and scales (the work does not depend on the values)."""
    try:
        from onnxq.cast import cuda_aot

        ok, why = cuda_aot.available()
    except Exception as err:
        ok, why = False, str(err)
    if not ok:
        print(f"C library CUDA gather: {why}")
        return []
    shape = (30522, 384)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randint(0, 256, (shape[0] * shape[1] // 2,), dtype=torch.uint8, device="cuda",
                      generator=gen)  # fmt: skip
    scale = torch.randint(110, 140, (shape[0] * shape[1] // 32,), dtype=torch.uint8, device="cuda")
    table = torch.randn(shape, device="cuda")
    rows = []
    for n in (512, 8192):
        idx = torch.randint(0, shape[0], (n,), generator=gen, device="cuda")
        host = idx.cpu()  # GatherMX reads its indices on the host (onnxruntime copies them)
        row: dict[str, Any] = {"rows": n}
        try:
            row["ms"] = bench(lambda h=host: cuda_aot.gather_packed("mxfp4", shape, h, q, scale),
                              iters)  # fmt: skip
            row["float_ms"] = bench(lambda i=idx: torch.nn.functional.embedding(i, table), iters)
        except Exception as err:
            row["error"] = str(err)[:200]
        print(f"C library CUDA gather: {json.dumps(row)}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--budget", type=float, default=150.0, help="seconds; later cases skip")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--sweep", action="store_true", help="pick the fast path's block first")
    args = parser.parse_args()
    from onnxq.cast.api import cast

    t_start = time.time()
    props = torch.cuda.get_device_properties(0)
    results: dict[str, Any] = {
        "device": props.name,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "records": [],
        "skipped": [],
    }
    if args.sweep:
        results["fast_config"] = sweep(args.iters)
        results["pack_layouts"] = pack_layouts(args.iters)
        results["codebook_configs"] = codebook_configs(args.iters)
    ao = torchao_casts()
    results["torchao"] = sorted(ao)
    for shape, dtype, formats in CASES:
        if time.time() - t_start > args.budget:
            results["skipped"].append(f"{shape} {dtype}: over the time budget")
            continue
        x = torch.randn(shape, dtype=dtype, device="cuda")
        nbytes = x.numel() * x.element_size()
        buf = torch.empty_like(x)
        copy_ms = bench(lambda x=x, buf=buf: buf.copy_(x), args.iters)
        copy_gbps = 2 * nbytes / copy_ms / 1e6
        print(f"{shape} {dtype}: copy {copy_ms:.3f} ms {copy_gbps:.0f} GB/s", flush=True)
        del buf
        for fmt in formats:
            if time.time() - t_start > args.budget:
                results["skipped"].append(f"{shape} {dtype} {fmt}: over the time budget")
                continue
            rec: dict[str, Any] = {
                "format": fmt, "shape": list(shape), "dtype": str(dtype).split(".")[-1],
                "copy_ms": copy_ms, "copy_gbps": copy_gbps,
            }  # fmt: skip
            for mode in ("virtual", "compress"):
                try:
                    q = cast(x, fmt, mode=mode, backend="triton")
                    out_bytes = nbytes if mode == "virtual" else qbytes(q)
                    del q

                    def run(x: Any = x, f: str = fmt, m: str = mode) -> Any:
                        return cast(x, f, mode=m, backend="triton")

                    rec[f"{mode}_ms"] = ms = bench(run, args.iters)
                    rec[f"{mode}_gbps"] = (nbytes + out_bytes) / ms / 1e6
                    rec[f"{mode}_frac_copy"] = rec[f"{mode}_gbps"] / copy_gbps
                    rec[f"{mode}_kernel_ms"] = ms = bench_graph(run, args.iters)
                    rec[f"{mode}_kernel_gbps"] = (nbytes + out_bytes) / ms / 1e6
                    rec[f"{mode}_kernel_frac_copy"] = rec[f"{mode}_kernel_gbps"] / copy_gbps
                except NotImplementedError as err:
                    rec["error"] = f"NotImplementedError: {err}"
                except Exception as err:  # record it, go on with the next format
                    rec["error"] = "".join(traceback.format_exception_only(type(err), err))[:300]
            for label, (fmts, dtypes, fn) in ao.items():
                if fmt not in fmts or dtype not in dtypes:
                    continue
                try:
                    out = nbytes // x.element_size() * (1 if fmt == "mxfp8e4" else 0.5)

                    def run_ao(x: Any = x, f: str = fmt, fn: Any = fn) -> Any:
                        return fn(x, f)

                    ms = bench(run_ao, args.iters)
                    rec[f"torchao_{label}_gbps"] = (nbytes + out * (1 + 1 / 32)) / ms / 1e6
                except Exception as err:
                    rec[f"torchao_{label}_error"] = str(err)[:300]
            results["records"].append(rec)
            print(json.dumps(rec), flush=True)
            torch.cuda.empty_cache()
        del x
        torch.cuda.empty_cache()
    results["c_library"] = c_library_path(args.iters)
    results["c_library_lookup"] = c_library_lookup(args.iters)
    results["c_library_gather"] = c_library_gather(args.iters)
    results["seconds"] = time.time() - t_start
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.json} in {results['seconds']:.0f} s")
    print(summary(results))


def _fraction_table(
    title: str, keys: tuple[str, ...], columns: tuple[str, ...], rows: list[dict[str, Any]]
) -> list[str]:
    """Markdown lines of a sweep: one row per record, its fractions of a copy per column."""
    if not rows:
        return []
    lines = ["", title, "", "| " + " | ".join(keys + columns) + " |"]
    lines.append("|" + "---|" * (len(keys) + len(columns)))
    for r in rows:
        cells = [str(r[k]) for k in keys]
        cells += [f"{r[c]:.2f}" if r.get(c) is not None else "error" for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def summary(results: dict[str, Any]) -> str:
    """A markdown table of the records (what RESULTS.md holds)."""
    lines = [
        f"Card: {results['device']} (torch {results['torch']}, triton {results['triton']}, "
        f"fast-path config {results.get('fast_config') or 'default'})",
        "",
        "GB/s = (bytes read + written) / time; (x copy) = fraction of the copy's GB/s; "
        "kernel = CUDA-graph replay, call = onnxq.cast from Python.",
        "",
        "| format | shape | dtype | copy GB/s | virtual kernel (x copy) | virtual call "
        "| compress kernel (x copy) | compress call | torchao to_mx | torchao triton |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results["records"]:

        def cell(key: str, frac: str | None = None, r: dict[str, Any] = r) -> str:
            if key not in r:
                return "-"
            text = f"{r[key]:.0f}"
            return f"{text} ({r[frac]:.2f})" if frac else text

        shape = "x".join(str(s) for s in r["shape"])
        lines.append(
            f"| {r['format']} | {shape} | {r['dtype']} | {r['copy_gbps']:.0f} | "
            f"{cell('virtual_kernel_gbps', 'virtual_kernel_frac_copy')} | "
            f"{cell('virtual_gbps', 'virtual_frac_copy')} | "
            f"{cell('compress_kernel_gbps', 'compress_kernel_frac_copy')} | "
            f"{cell('compress_gbps', 'compress_frac_copy')} | "
            f"{cell('torchao_to_mx_gbps')} | {cell('torchao_triton_to_mxfp8_dim0_gbps')} |"
            + (f" {r['error'][:80]}" if "error" in r else "")
        )
    lines += _fraction_table(
        "Compress kernels by packing layout (`ONNXQ_TRITON_PACK_GROUP`, 8192x8192), x copy:",
        ("format", "dtype"),
        PACK_LAYOUTS,
        results.get("pack_layouts") or [],
    )
    lines += _fraction_table(
        "Codebook kernel by `ONNXQ_TRITON_CB_CONFIG` (default 512:4; cb41fi_e2m2fnuz_e8m0_t32, "
        "8192x8192), x copy:",
        ("dtype", "mode"),
        CB_CONFIGS,
        results.get("codebook_configs") or [],
    )
    rows = results.get("c_library") or []
    if rows:
        lines += [
            "",
            "C library CUDA path (`cuda_aot.quantize_packed`, 8192x8192, calls; fast kernel: "
            "the fast call replayed from a CUDA graph; channels: the same elements as "
            "[64, 1024, 32, 32] along axis 1, packed and values alone), x copy:",
            "",
            "| format | dtype | fast kernels | fast kernel (graph) | general kernels | channels "
            "| channels values |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            cells = []
            for label in ("fast", "graph", "general", "channels", "channels_values"):
                v = r.get(f"{label}_frac_copy")
                cells.append(f"{v:.2f}" if v is not None else str(r.get(f"{label}_error")))
            lines.append(f"| {r['format']} | {r['dtype']} | {' | '.join(cells)} |")
    rows = results.get("c_library_lookup") or []
    if rows:
        lines += [
            "",
            "CodebookLookup on the C library's CUDA path (`cuda_aot.lookup_packed`, 8192x8192, "
            "bytes read + written), x copy:",
            "",
            "| codebook | output | x copy | ms |",
            "|---|---|---|---|",
        ]
        for r in rows:
            frac = f"{r['frac_copy']:.2f}" if "frac_copy" in r else r.get("error")
            ms = f"{r['ms']:.3f}" if "ms" in r else ""
            lines.append(f"| {r['format']} | {r['dtype']} | {frac} | {ms} |")
    rows = results.get("c_library_gather") or []
    if rows:
        lines += [
            "",
            "GatherMX on the C library's CUDA path (`cuda_aot.gather_packed`, mxfp4 table "
            "30522x384, calls, host indices) against torch's embedding of the float table:",
            "",
            "| rows | ms | float ms |",
            "|---|---|---|",
        ]
        for r in rows:
            cells = [f"{r[k]:.3f}" if k in r else str(r.get("error")) for k in ("ms", "float_ms")]
            lines.append(f"| {r['rows']} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
