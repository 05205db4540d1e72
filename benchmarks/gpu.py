"""Bandwidth of the Triton cast engine on a GPU (issue 5, item 4).

For 8192x8192 and 16384x16384 bfloat16 / float32 tensors and each format, the achieved
bandwidth (bytes read + bytes written, per second) of

- ``virtual``: ``onnxq.cast(x, fmt, backend="triton")`` (read x, write a tensor like x);
- ``compress``: ``onnxq.cast(x, fmt, mode="compress", backend="triton")`` (read x, write the
  packed codes, scales and meta bits);

next to a device-to-device copy of the input (``torch.Tensor.copy_``, read + write), and,
where ``torchao`` is importable, torchao's MX cast (``MXTensor.to_mx``) for MXFP8/MXFP4.
Target: 80% of the copy's bandwidth, and at least torchao's speed.

Usage: ``PYTHONPATH=. python benchmarks/gpu.py --json OUT.json [--budget SECONDS]``.
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from typing import Any

import torch

FORMATS = ["mxfp8e4", "mxfp6e2", "mxfp4", "mxint8", "bfp16", "mx6", "nvfp4"]
FORMATS += ["cb41fi_e2m2fnuz_e8m0_t32"]  # a codebook: recorded as not implemented
CASES = [
    ((8192, 8192), torch.bfloat16, FORMATS),
    ((8192, 8192), torch.float32, FORMATS),
    ((16384, 16384), torch.bfloat16, FORMATS),
    ((16384, 16384), torch.float32, ["mxfp8e4", "mxfp4", "nvfp4"]),  # kept few: 1 GiB each
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


def qbytes(q: Any) -> int:
    fields = (q.data, q.scale, q.zero, q.tenscale, q.meta, q.mask)
    return sum(f.numel() * f.element_size() for f in fields if f is not None)


def torchao_cast() -> Any:
    """torchao's MX cast, or None (optional)."""
    try:
        from torchao.prototype.mx_formats.mx_tensor import MXTensor
    except Exception:  # any import problem means "absent"
        return None
    try:
        from torchao.prototype.mx_formats.constants import DTYPE_FP4
    except Exception:
        DTYPE_FP4 = getattr(torch, "float4_e2m1fn_x2", None)
    elems = {"mxfp8e4": torch.float8_e4m3fn, "mxfp4": DTYPE_FP4}

    def run(x: torch.Tensor, fmt: str) -> Any:
        return MXTensor.to_mx(x, elems[fmt], 32)

    run.formats = {k for k, v in elems.items() if v is not None}  # type: ignore[attr-defined]
    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", required=True)
    parser.add_argument("--budget", type=float, default=150.0, help="seconds; later cases skip")
    parser.add_argument("--iters", type=int, default=10)
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
    ao = torchao_cast()
    results["torchao"] = ao is not None
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
            try:
                ms = bench(lambda x=x, f=fmt: cast(x, f, backend="triton"), args.iters)
                rec["virtual_ms"] = ms
                rec["virtual_gbps"] = 2 * nbytes / ms / 1e6
                rec["virtual_frac_copy"] = rec["virtual_gbps"] / copy_gbps
                q = cast(x, fmt, mode="compress", backend="triton")
                out_bytes = qbytes(q)
                del q
                ms = bench(
                    lambda x=x, f=fmt: cast(x, f, mode="compress", backend="triton"), args.iters
                )
                rec["compress_ms"] = ms
                rec["compress_bytes_out"] = out_bytes
                rec["compress_gbps"] = (nbytes + out_bytes) / ms / 1e6
                rec["compress_frac_copy"] = rec["compress_gbps"] / copy_gbps
            except NotImplementedError as err:
                rec["error"] = f"NotImplementedError: {err}"
            except Exception as err:  # record it, go on with the next format
                rec["error"] = "".join(traceback.format_exception_only(type(err), err)).strip()
            if ao is not None and fmt in ao.formats:
                try:
                    ms = bench(lambda x=x, f=fmt: ao(x, f), args.iters)
                    ao_out = nbytes // x.element_size() * (1 if fmt == "mxfp8e4" else 0.5)
                    rec["torchao_ms"] = ms
                    rec["torchao_gbps"] = (nbytes + ao_out * (1 + 1 / 32)) / ms / 1e6
                except Exception as err:
                    rec["torchao_error"] = str(err)[:300]
            results["records"].append(rec)
            print(json.dumps(rec), flush=True)
            torch.cuda.empty_cache()
        del x
        torch.cuda.empty_cache()
    results["seconds"] = time.time() - t_start
    with open(args.json, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.json} in {results['seconds']:.0f} s")
    print(summary(results))


def summary(results: dict[str, Any]) -> str:
    """A markdown table of the records (what RESULTS.md holds)."""
    lines = [
        f"Card: {results['device']} (torch {results['torch']}, triton {results['triton']})",
        "",
        "| format | shape | dtype | copy GB/s | virtual GB/s (x copy) | compress GB/s (x copy) "
        "| torchao GB/s |",
        "|---|---|---|---|---|---|---|",
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
            f"{cell('virtual_gbps', 'virtual_frac_copy')} | "
            f"{cell('compress_gbps', 'compress_frac_copy')} | {cell('torchao_gbps')} |"
            + (f" {r['error'][:80]}" if "error" in r else "")
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
