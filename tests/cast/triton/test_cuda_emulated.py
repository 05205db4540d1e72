"""The library's CUDA launchers run on the CPU: a fake driver, Triton's interpreter as the GPU.

`fake_libcuda.c` stands in for libcuda.so.1 (through ``ONNXQ_LIBCUDA``): host memory as device
memory, every launch handed to `fake_cuda.Emulator`, which runs the launched image's kernel
(found by its bytes among the build's) in the interpreter with the parameters the library wrote.
So the C++ of ``ops/src/cuda_launch.cc`` and ``cuda_lookup.cc`` - the kernel chosen, every
parameter, the grid, scratch, table uploads, unpacking, the order of launches, the refusals -
is checked bit for bit against the reference without a GPU (`run_emulated` has the cases). Only
the images' machine code is left to the GPU tests of `test_cuda_aot`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from onnxq.cast.aot_spec import CB_INNER_OPS, FLOATS, PRESETS, cb_block, cb_geometry
from onnxq.formats.datatype import datatype

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
AOT = ROOT / "ops" / "build" / "aot"
HAVE_TRITON = all(importlib.util.find_spec(m) is not None for m in ("torch", "triton"))
pytestmark = pytest.mark.needs_native


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAVE_TRITON:
        pytest.skip("torch/triton not installed: the library has no GPU kernels")
    from onnxq.cast import cuda_aot
    from tests.cast.triton.fake_cuda import build

    n, text = cuda_aot.info()
    manifest = AOT / "manifest.json"
    if not n or not manifest.is_file():
        pytest.skip(f"the library embeds no GPU kernels from {AOT} ({text})")
    if len(json.loads(manifest.read_text())["kernels"]) != n:
        pytest.skip(f"{AOT} is not what the library embeds: rebuild it (pip install -e .)")
    fake = build(tmp_path_factory.mktemp("fakecuda"))
    if fake is None:
        pytest.skip("no C compiler for the fake driver")
    return fake


def _run(script: str, fake: Path, *args: str, **env_vars: str) -> tuple[dict, str]:
    """The script's JSON result and its stderr, run on the fake driver."""
    env = {k: v for k, v in os.environ.items() if k != "ONNXQ_CUDA_FAST"}
    env.update(TRITON_INTERPRET="1", ONNXQ_LIBCUDA=str(fake), **env_vars)
    proc = subprocess.run(
        [sys.executable, str(HERE / script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


@pytest.fixture(scope="module")
def emulated(fake_driver: Path) -> dict:
    return _run("run_emulated.py", fake_driver)[0]


@pytest.fixture(scope="module")
def emulated_ort(fake_driver: Path) -> tuple[dict, str]:
    pytest.importorskip("onnxruntime")
    return _run("run_emulated_ort.py", fake_driver, ONNXQ_CUDA_OPS_ON_CPU_PROVIDER="1")


def test_every_launch_ran_and_every_result_is_the_reference(emulated: dict) -> None:
    assert emulated["errors"] == []
    assert emulated["bad"] == []


def _expected_block(
    code: str, shape: tuple[int, ...], out: int, axis: int = -1
) -> tuple[list[str], str]:
    """The unpack kernels and the decode block the Python mirror (aot_spec) expects."""
    dt = datatype(code)
    book, tile = dt.nspec, dt.sspec.tiles[0]
    geo = cb_geometry(
        shape, tile.size, tile.subtile, 8, dt.sspec.scale.bias, book.index_bits, book.meta_bits,
        axis,
    )  # fmt: skip
    op, nsub, sub, _ = cb_block(geo["TC"], tile.subtile)
    op = CB_INNER_OPS[op] if geo["inner"] > 1 else op  # the LAST=False compile
    unpack = [f"unpack{book.index_bits}"] if book.index_bits < 8 else []
    unpack += [f"unpack{book.meta_bits}"] if book.meta_bits else []
    return unpack, f"cb{op}_{nsub}x{sub}_{FLOATS[out]}"


def test_codebooks_take_the_block_the_generator_expects(emulated: dict) -> None:
    # The C++ choice of kernel (cuda_lookup.cc find_block, its geometry) is the Python mirror's
    from tests.cast.triton.run_emulated import GENERIC, LOOKUPS, LOOKUPS_AXIS

    cases = [(code, code, shape, out, -1) for code, shape, out in LOOKUPS]
    cases += [(f"{g} (table)", i, shape, out, -1) for g, i, shape, out in GENERIC]
    cases += [(f"{c} {s} axis {a}", c, s, out, a) for c, s, a, out in LOOKUPS_AXIS]
    for name, code, shape, out, axis in cases:
        unpack, block = _expected_block(code, shape, out, axis)
        assert emulated["launches"][name] == [*unpack, block], name
    # masked blocks and long tiles are among them, along the last axis and along another
    launched = {la[-1].rsplit("_", 1)[0] for la in emulated["launches"].values() if la}
    assert {"cb12_4x8", "cb12_8x32", "cb12_16x8", "cb13_1x512", "cb11_1x1024"} <= launched
    assert {"cb19_4x8", "cb19_8x32", "cb20_1x512"} <= launched


def test_the_gather_wrapper_refuses_before_any_launch(emulated: dict) -> None:
    # cuda_aot.gather_packed (GatherMX's launch path; its bits: the test above, "wrapper
    # gather ..." and "wrappers ..." cases): a row past the table, tiles along the rows
    refused, launches = emulated["refused"], emulated["launches"]
    assert refused["wrapper gather row 3"].endswith("row 3 is out of range for a table of 3 rows")
    along = refused["wrapper gather axis 0"]
    assert "its tiles run along the table's rows (axis 0 of [64, 3])" in along, along
    assert launches["wrapper gather row 3"] == [] and launches["wrapper gather axis 0"] == []


def test_codebook_refusals_name_the_problem(emulated: dict) -> None:
    refused = emulated["refused"]
    want = {
        "2-d tiles": "tiles along one axis only, not 2-D tiles",
        "sparsity": "N:M sparsity has no CUDA kernel",
        "wide scale": "scale codes of 10 bits have no CUDA kernel",
        "long tile with subtiles": "tiles of 2048 elements with subtiles of 8",
        "subtiles of 64": "tiles of 128 elements with subtiles of 64",
        "not a codebook": "is not a codebook",
        "generic without a table": "has no mappings of its own",
        "host memory": "Q is not CUDA device memory",
        "no meta": "the Meta input is required",
    }
    for case, needle in want.items():
        assert needle in refused.get(case, ""), (case, refused.get(case))
        assert emulated["launches"][case] == [], case  # refused before any launch
    for case in want:
        if case not in ("not a codebook", "generic without a table", "host memory", "no meta"):
            assert "run this node on the CPU" in refused[case], case
    # every lookup and preset case ran (the modes' and the gather wrapper's refusals: the tests
    # below and above)
    gathers = {"wrapper gather row 3", "wrapper gather axis 0"}
    assert set(refused) == set(want) | {"modes stochastic", "modes search"} | gathers


def test_modes_run_on_the_general_kernels_and_the_rest_are_refused(emulated: dict) -> None:
    # Modes other than the defaults: the general kernels with the mode parameters the
    # launcher reads from its table (bits: the first test), on shapes the fast kernel takes
    # for the default modes; stochastic rounding and scale search refused before a launch.
    # Modes that change nothing for the format keep the fast kernel: scale modes choose a
    # float element's power-of-two scale (nothing for integer elements or float scales), the
    # int range is an integer element's.
    from tests.cast.triton.run_emulated import MODE_CASES

    la = emulated["launches"]
    cases = [(p, j, case) for p in PRESETS for j, case in enumerate(MODE_CASES)]
    assert len([n for n in la if " modes " in n]) == len(cases) * 2
    for preset, j, case in cases:
        dt = datatype(preset)
        inert = {"int_range"} if dt.nspec.is_float else set()
        if not dt.nspec.is_float or not dt.sspec.scale.is_exponent:
            inert.add("scale_mode")
        fast = set(case) <= inert
        for layout in ("packed", "unpacked"):
            kinds = _kinds(la[f"{preset} modes {j} {layout}"])
            assert ("f" in kinds) == fast and ("q" in kinds) != fast, (preset, case, kinds)
    refused = emulated["refused"]
    assert "stochastic rounding has no CUDA kernel" in refused["modes stochastic"]
    assert "scale mode 'search' has no CUDA kernel" in refused["modes search"]
    assert la["modes stochastic"] == la["modes search"] == []


@pytest.mark.parametrize("preset", PRESETS)
def test_whole_tiles_along_a_non_last_axis_take_the_fast_kernels(
    emulated: dict, preset: str
) -> None:
    # the INNER compile of the fast values kernel (its bits: the first test); NVFP4's tensor
    # amax pass first
    from tests.cast.triton.run_emulated import INNER_FAST_SHAPES

    dt = datatype(preset)
    amax = ["amax"] if dt.sspec.tenscale is not None else []
    packs = ["pack"] * (int(dt.nspec.bits < 8) + int(bool(dt.sspec.tiles[0].subtile)))
    for shape in INNER_FAST_SHAPES:
        la = emulated["launches"]
        symbols = la[f"{preset} {shape} axis 1 values"]
        assert _kinds(symbols) == [*amax, "f"] and symbols[-1].startswith("f21_"), symbols
        # values and codes: two INNER passes (after NVFP4's amax pass)
        symbols = la[f"{preset} {shape} axis 1 unpacked"]
        assert _kinds(symbols) == [*amax, "f", "f"], symbols
        assert symbols[-2].startswith("f21_") and symbols[-1].startswith("f22_"), symbols
        # QuantizeMX's layouts: the codes pass into scratch, then the pack kernels
        symbols = la[f"{preset} {shape} axis 1 packed"]
        assert _kinds(symbols) == [*amax, "f", *packs] and symbols[len(amax)].startswith("f22_")


def test_other_names_of_an_embedded_format_take_its_kernels(emulated: dict) -> None:
    # the bits: the first test
    from tests.cast.triton.run_emulated import ALIASES

    for alias, _ in ALIASES:
        assert f"alias {alias}" not in emulated["refused"], emulated["refused"][f"alias {alias}"]
        assert _kinds(emulated["launches"][f"alias {alias}"]) == ["f"], alias


def _kinds(symbols: list[str]) -> list[str]:
    """The kernels' kinds (images are shared, so a symbol names the first kernel of its image)."""
    return [sym.split("_")[0].rstrip("0123456789") for sym in symbols]


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_launchers_take_the_fast_and_general_paths(emulated: dict, preset: str) -> None:
    dt = datatype(preset)
    amax, stats = (["amax"], ["stats"]) if dt.sspec.tenscale is not None else ([], [])
    packs = int(dt.nspec.bits < 8) + int(bool(dt.sspec.tiles[0].subtile))
    la = {
        name: _kinds(v) for name, v in emulated["launches"].items() if name.startswith(preset + " ")
    }
    fast, odd = f"{preset} (3, 64)", f"{preset} (3, 36)"
    # a last axis that is a multiple of the tile: one pass writes the packed layouts
    assert la[f"{fast} quantize 0"] == la[f"{fast} quantize 2"] == [*amax, "f"]
    assert la[f"{fast} unpacked"] == [*amax, "f", "f"]  # values, then codes
    # the general kernel (ONNXQ_CUDA_FAST=0, a misaligned input, a last axis of 40), packing
    general = [*stats, "q", *["pack"] * packs]
    assert la[f"{fast} quantize general"] == la[f"{fast} quantize misaligned"] == general
    assert la[f"{odd} quantize 0"] == la[f"{odd} quantize 2"] == general
    assert la[f"{odd} unpacked"] == [*stats, "q"]  # values and codes in one pass
    for name in (f"{fast} dequantize 0", f"{odd} dequantize 2"):
        assert la[name] == [*["unpack"] * packs, "dq"]


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_launchers_tile_along_a_non_last_axis(emulated: dict, preset: str) -> None:
    # the general kernels' LAST=False compile (operations 14-17), the bits checked above
    dt = datatype(preset)
    stats = ["stats"] if dt.sspec.tenscale is not None else []
    packs = int(dt.nspec.bits < 8) + int(bool(dt.sspec.tiles[0].subtile))
    from tests.cast.triton.run_emulated import INNER_SHAPE

    tag = f"{preset} {INNER_SHAPE} axis 1"
    la = emulated["launches"]
    for x_type in (0, 2):
        assert _kinds(la[f"{tag} quantize {x_type}"]) == [*stats, "q", *["pack"] * packs]
    assert _kinds(la[f"{tag} unpacked"]) == [*stats, "q"]
    for out in (0, 2):
        assert _kinds(la[f"{tag} dequantize {out}"]) == [*["unpack"] * packs, "dqi"]
    quants = [s for n, v in la.items() if n.startswith(tag) for s in v if s.startswith("q")]
    assert quants and all(s.split("_")[0] in ("q14", "q15", "q16") for s in quants), quants


# -- onnxruntime's CUDA provider kernels (ort_kernel_cuda.cc), run by a CPU onnxruntime -------


def test_onnxruntime_cuda_kernels_equal_the_reference(emulated_ort: tuple[dict, str]) -> None:

    result, _ = emulated_ort
    assert result["errors"] == []
    assert result["bad"] == []
    ran = [n for n in result["launches"] if n.startswith("ort ") and n not in result["refused"]]
    # every preset quantized (float32, bfloat16) and decoded (three output types) on both
    # shapes, four codebooks: each through the kernels
    assert len([n for n in ran if " quantize " in n]) == len(PRESETS) * 2 * 2
    assert len([n for n in ran if " dequantize " in n]) == len(PRESETS) * 2 * 3
    assert len([n for n in ran if " qdq " in n]) == len(PRESETS) * 2 * 2
    # tiles along axis 1 of a (2, 40, 3) X: the general kernels' LAST=False compile
    inner = [n for n in ran if n.startswith("ort axis 1 ")]
    assert len(inner) == 9 and all(result["copies"][n][0] == 0 for n in inner)
    for n in inner:
        kinds = _kinds(result["launches"][n])
        assert ("q" in kinds) != ("dqi" in kinds) and "f" not in kinds, (n, kinds)
    assert len([n for n in ran if n.startswith("ort lookup ")]) == 5
    assert len([n for n in ran if n.startswith("ort gather ")]) == 9  # 7 + generic + no rows
    assert all(result["launches"][n] for n in ran if n != "ort gather no rows")


@pytest.mark.parametrize("preset", ["mxfp8e4", "mx6", "nvfp4"])
def test_onnxruntime_cuda_quantize_and_qdq_take_the_fast_and_general_kernels(
    emulated_ort: tuple[dict, str], preset: str
) -> None:
    la = {n: _kinds(v) for n, v in emulated_ort[0]["launches"].items()}
    amax, stats = (["amax"], ["stats"]) if preset == "nvfp4" else ([], [])
    packs = {"mxfp8e4": 0, "mx6": 2, "nvfp4": 1}[preset]
    for x_type in (0, 2):
        assert la[f"ort {preset} (3, 64) quantize {x_type}"] == [*amax, "f"]
        assert la[f"ort {preset} (3, 36) quantize {x_type}"] == [*stats, "q", *["pack"] * packs]
        # QuantizeDequantizeMX: the values kernel alone
        assert la[f"ort {preset} (3, 64) qdq {x_type}"] == [*amax, "f"]
        assert la[f"ort {preset} (3, 36) qdq {x_type}"] == [*stats, "q"]


def test_onnxruntime_gathermx_copies_the_rows_then_decodes_them_on_the_kernels(
    emulated_ort: tuple[dict, str],
) -> None:
    # GatherMX on the device: one row copy per packed stream (codes, scales, and shift or meta
    # bits), the codes' unpacking, then one decode of the gathered rows (the bits: the
    # reference's, test above); only the row indices (int32) go to the device, and the
    # codebook's table; nothing to the host, no synchronisation, no warning
    from tests.cast.triton.run_emulated_ort import GATHERS

    result, log = emulated_ort
    sections = _log_sections(log)
    names = [f"ort gather {dt} {shape} axis {axis} {i % 3}" for i, (dt, shape, axis) in
             enumerate(GATHERS)] + ["ort gather generic"]  # fmt: skip
    for name in names:
        assert name not in result["refused"], (name, result["refused"].get(name))
        kinds = _kinds(result["launches"][name])
        book = "cb41" in name or "generic" in name
        streams = 3 if "mx6" in name or book else 2
        assert kinds[:streams] == ["gather"] * streams, (name, kinds)
        assert kinds[-1] in ("dq", "dqi", "cb"), (name, kinds)
        table = 2 ** (4 + 1) * 8 if book else 0  # float64 [2^meta][2^index]
        assert result["copies"][name] == [0, 6 * 4 + table, 0], name
        assert "host copies" not in sections[name], name
    # no rows: an empty Y, nothing launched; an index past the table: the CPU op's message,
    # before any launch
    assert result["launches"]["ort gather no rows"] == []
    assert "ort gather no rows" not in result["refused"]
    message = result["refused"]["ort gather out of range"]
    assert "index 6 (at flat position 1 of Indices) is out of range for a table of 6 rows" in (
        message
    )
    assert result["launches"]["ort gather out of range"] == []


def test_onnxruntime_nodes_with_modes_run_on_the_general_kernels(
    emulated_ort: tuple[dict, str],
) -> None:
    # QuantizeMX and QuantizeDequantizeMX with modes other than the defaults: no host copy,
    # the general kernel (the bits: the reference's, test above)
    from tests.cast.triton.run_emulated_ort import MODE_NODES

    result, _ = emulated_ort
    names = [f"ort modes {dt} {op}" for dt, _ in MODE_NODES for op in ("quantize", "qdq")]
    for name in names:
        assert name not in result["refused"], (name, result["refused"].get(name))
        kinds = _kinds(result["launches"][name])
        assert "q" in kinds and "f" not in kinds, (name, kinds)
        assert result["copies"][name][:2] == [0, 0], name
    # dtype="mxfp8" (mxfp8e4's code): its fast kernel, no host copy
    for name in ("ort alias mxfp8 qdq", "ort spelled e4m3 qdq"):
        assert _kinds(result["launches"][name]) == ["f"], name
        assert result["copies"][name][:2] == [0, 0], name


def _log_sections(log: str) -> dict[str, str]:
    """The onnxruntime log of each case (run_emulated_ort prints "== case" before each)."""
    sections: dict[str, str] = {}
    name = ""
    for line in log.splitlines():
        if line.startswith("== "):
            name = line[3:]
            sections[name] = ""
        elif name:
            sections[name] += line + "\n"
    return sections


HOST_REASONS = {
    "host 2-d tiles": "dtype 'int8_e8m0_t8_t4' has no CUDA kernel in this library",
    "host codebook quantize": "dtype 'cb41fi_e2m2fnuz_e8m0_t32' has no CUDA kernel",
    "host stochastic": "stochastic rounding has no CUDA kernel",
    "host qdq 2-d tiles": "dtype 'int8_e8m0_t8_t4' has no CUDA kernel",
    "host dequantize 2-d tiles": "dtype 'int8_e8m0_t8_t4' has no CUDA kernel",
    "host lookup cb41fi_e2m2fnuz_e8m0_t4_t8": "tiles along one axis only, not 2-D tiles",
    "host lookup cb41fi_e2m2fnuz_e8m0_t128s64": "tiles of 128 elements with subtiles of 64",
    "host gather mxfp4 (64, 6) axis 0": "its tiles run along the table's rows (axis 0 of [64, 6])",
    "host gather int8_channel (6, 16) axis -1": "dtype 'int8_channel' has no CUDA kernel",
}


def test_the_warning_names_a_hostile_node_on_one_short_line(
    emulated_ort: tuple[dict, str],
) -> None:
    result, log = emulated_ort
    assert "host odd name" not in result["refused"] and "host odd name" not in result["bad"]
    (line,) = [ln for ln in _log_sections(log)["host odd name"].splitlines() if "host copies" in ln]
    # the line break became '?', the name stops after 200 characters
    assert "node 'a?b" + "c" * 197 + "...' runs on the CPU" in line, line


def test_nodes_the_kernels_cannot_run_take_the_cpu_kernel_on_host_copies(
    emulated_ort: tuple[dict, str],
) -> None:
    result, log = emulated_ort
    sections = _log_sections(log)
    host = sorted(n for n in result["launches"] if n.startswith("host ") and n != "host odd name")
    assert host == sorted(HOST_REASONS)
    for name, reason in HOST_REASONS.items():
        assert name not in result["refused"], (name, result["refused"].get(name))
        assert name not in result["bad"]  # the reference's bits (test above: bad is empty)
        assert result["launches"][name] == [], name  # no kernel: the CPU kernel ran
        # both runs copied every device input to the host and every output back, each
        # followed by a synchronisation
        to_host, to_device, syncs = result["copies"][name]
        assert [to_host, to_device] == result["sizes"][name], name
        assert syncs >= 4, name
        # one warning, at the first run at the latest, naming the node and the reason
        warnings = [ln for ln in sections[name].splitlines() if "with host copies" in ln]
        assert len(warnings) == 1, (name, sections[name])
        assert f"node '{name}' runs on the CPU" in warnings[0], warnings[0]
        assert reason in warnings[0], warnings[0]
        assert "ONNXQ_CUDA_HOST_FALLBACK=0" in warnings[0]
    # the device kernels' nodes copy nothing to the host
    for name in result["launches"]:
        if name.startswith("ort "):
            assert result["copies"][name][0] == 0, name
            assert "host copies" not in sections[name], name


# The host cases' nodes: (op type, dtype, mode attributes)
HOST_NODES = {
    "host 2-d tiles": ("QuantizeMX", "int8_e8m0_t8_t4", {}),
    "host codebook quantize": ("QuantizeMX", "cb41fi_e2m2fnuz_e8m0_t32", {}),
    "host stochastic": ("QuantizeMX", "mxfp8e4", {"round_mode": "stochastic"}),
    "host qdq 2-d tiles": ("QuantizeDequantizeMX", "int8_e8m0_t8_t4", {}),
    "host dequantize 2-d tiles": ("DequantizeMX", "int8_e8m0_t8_t4", {}),
    **{
        f"host lookup {c}": ("CodebookLookup", c, {})
        for c in ("cb41fi_e2m2fnuz_e8m0_t4_t8", "cb41fi_e2m2fnuz_e8m0_t128s64")
    },
    # GatherMX: its table's shape and axis too
    "host gather mxfp4 (64, 6) axis 0": ("GatherMX", "mxfp4", {"shape": [64, 6], "axis": 0}),
    "host gather int8_channel (6, 16) axis -1": ("GatherMX", "int8_channel", {"shape": [6, 16]}),
}


def test_node_support_gives_the_reason_the_session_logs(emulated_ort: tuple[dict, str]) -> None:
    # `onnxq inspect`'s report (cuda_aot.node_support, no GPU) against what the CUDA
    # provider's kernels decided at session creation: the same reason, word for word, for the
    # host cases; none for the nodes that launched kernels
    from onnxq.cast import cuda_aot
    from tests.cast.triton.run_emulated_ort import MODE_NODES

    _, log = emulated_ort
    sections = _log_sections(log)
    assert set(HOST_NODES) == set(HOST_REASONS)
    for name, (op, dtype, modes) in HOST_NODES.items():
        why = cuda_aot.node_support(op, dtype, **modes)
        (line,) = [ln for ln in sections[name].splitlines() if "host copies" in ln]
        assert f"a run): {why}. ONNXQ_CUDA_HOST_FALLBACK=0" in line, (why, line)
    for dtype, modes in MODE_NODES:
        for op, case in (("QuantizeMX", "quantize"), ("QuantizeDequantizeMX", "qdq")):
            assert cuda_aot.node_support(op, dtype, **modes) == "", (op, dtype, modes)
            assert "host copies" not in sections[f"ort modes {dtype} {case}"]


def test_host_fallback_off_refuses_the_same_nodes(emulated_ort: tuple[dict, str]) -> None:
    result, _ = emulated_ort
    strict = {n for n in result["launches"] if n.startswith("strict ")}
    assert len(strict) == 3
    for name in strict:
        reason = HOST_REASONS[name.replace("strict", "host")]
        message = result["refused"][name]
        assert reason in message and "ONNXQ_CUDA_HOST_FALLBACK=0 refuses" in message, message
        assert result["launches"][name] == [] and result["copies"][name] == [0, 0, 0], name
    # before any Run: the session is not made
    assert all("initialization" in result["refused"][n] for n in strict)


def test_an_empty_x_gives_the_cpu_ops_outputs_without_a_launch(
    emulated_ort: tuple[dict, str],
) -> None:
    result, log = emulated_ort
    assert "empty x" not in result["refused"] and "empty x" not in result["bad"]
    # NVFP4 of a (0, 64) X: Q and Scale have no bytes; TenScale's uint32 (code 0) is the only
    # output copied to the device, then one synchronisation; no warning (nothing to speed up)
    assert result["launches"]["empty x"] == [] and result["copies"]["empty x"] == [0, 4, 1]
    assert "host copies" not in _log_sections(log)["empty x"]


# -- a real model through the CUDA provider's kernels (run_emulated_model.py) -----------------

MODEL_CASES = [
    # the activations fused into QuantizeDequantizeMX (the default), one pass each; weights in
    # 2-D tiles, which the GPU kernels do not decode: DequantizeMX on the host fallback
    dict(model="minilm", weights="int8_e8m0_t8_t4", activations="mxfp8e4", fuse=True),
    # QuantizeMX -> DequantizeMX pairs: packed codes and shift bits between two launches; the
    # formats of the mx6-deploy recipe (the weights stored as float values: packed presets
    # would launch on onnxruntime's initializer memory, outside the fake driver's blocks)
    dict(model="minilm", weights="mx6", activations="mx9", fuse=False, weight_storage="fake"),
    # a recipe's rounding and scale modes: every activation cast on the general kernels
    dict(
        model="minilm",
        weights="bfp16",
        activations="mxfp8e4",
        fuse=True,
        weight_storage="fake",
        modes=dict(round_mode="away", scale_mode="midmax"),
    ),
]


def _ort_headers() -> Path | None:
    """onnxruntime's C API headers (the build fetches them into ops/build/ort)."""
    for folder in (
        os.environ.get("ONNXRUNTIME_INCLUDE_DIR"),
        ROOT / "ops/build/ort/root/usr/include/onnxruntime",
    ):
        if folder and (Path(folder) / "onnxruntime_c_api.h").is_file():
            return Path(folder)
    return None


def _model_on_cuda_kernels(fake_driver: Path, case: dict, tmp: Path) -> tuple[dict, str]:
    """Run `run_emulated_model` for the case; its outputs are the CPU provider's, bit for bit."""
    pytest.importorskip("onnxruntime")
    from onnxq import runtime
    from tests.cast.triton.fake_cuda import build_allocator
    from tests.cast.triton.run_emulated_model import quantized
    from tests.models.real import MissingModelError, example_inputs, model_path

    try:
        model_path(case["model"])
    except MissingModelError as err:
        pytest.skip(str(err))
    include = _ort_headers()
    if include is None:
        pytest.skip("no onnxruntime C API headers (built with the library into ops/build/ort)")
    want = runtime.session(
        quantized(case), providers=["CPUExecutionProvider"], decode_weights="run"
    ).run(None, example_inputs(case["model"]))
    np.savez(tmp / "want.npz", *want)
    arg = dict(case, allocator=str(build_allocator(tmp, include)), want=str(tmp / "want.npz"))
    result, log = _run(
        "run_emulated_model.py", fake_driver, json.dumps(arg), ONNXQ_CUDA_OPS_ON_CPU_PROVIDER="1"
    )
    assert result["errors"] == []
    assert len(result["same"]) == len(want) and all(result["same"]), result["same"]
    return result, log


@pytest.mark.parametrize(
    "case",
    MODEL_CASES,
    ids=lambda c: f"{c['activations']}-fuse{c['fuse']}{'-modes' * ('modes' in c)}",
)
def test_a_real_model_on_the_cuda_provider_kernels_gives_the_cpu_bits(
    fake_driver: Path, case: dict, tmp_path: Path
) -> None:
    result, log = _model_on_cuda_kernels(fake_driver, case, tmp_path)
    kinds = _kinds(result["kernels"])
    # every activation on the kernels: 24 casts (3 layers x 8); the fast kernel where the
    # tiled axis is a multiple of the tile (the hidden size; the keys' head dim, 32, along
    # axis 2: the INNER values kernel, or QuantizeMX's INNER codes kernel), the general one
    # elsewhere (the values along the 16 tokens, axis 2 too: whole MX9 tiles, not MXFP8's 32;
    # on the LAST=False compile), and for modes
    inner = [k for k in result["kernels"] if k.split("_")[0] in ("q14", "q15", "q16")]
    inner_fast = [k for k in result["kernels"] if k.startswith(("f21_", "f22_"))]
    want = (6, 0) if "modes" in case else (0, 6) if case["activations"] == "mx9" else (3, 3)
    assert (len(inner), len(inner_fast)) == want, result["kernels"]
    assert kinds.count("f") + kinds.count("q") == 24, kinds
    # the modes: the general kernels only (the fast one is compiled for the defaults)
    assert kinds.count("f") == 0 if "modes" in case else kinds.count("f") >= 12, kinds
    warnings = [ln for ln in log.splitlines() if "with host copies" in ln]
    if "modes" in case:
        assert warnings == [], warnings  # float weights, activations on the GPU kernels
    elif case["fuse"]:
        # the 2-D tile weights took the host fallback, each with its one warning: 18 MatMul
        # weights, 3 embedding tables (GatherMX: tiles whose rows run along the table's rows)
        assert len(warnings) == 21, warnings
        assert all("int8_e8m0_t8_t4" in w for w in warnings), warnings
        assert len([w for w in warnings if "[GatherMX]" in w]) == 3, warnings
    else:  # each pair: a quantize, then unpacking and the decode
        assert kinds.count("dq") + kinds.count("dqi") == 24, kinds
        assert warnings == [], warnings


def test_a_real_model_gathers_its_packed_embeddings_on_the_cuda_kernels(
    fake_driver: Path, tmp_path: Path
) -> None:
    # packed weights as `onnxq quantize` writes them (embedding tables in GatherMX, the
    # default), the tables in MXFP4: the 3 embedding lookups copy their rows out and decode
    # them on the kernels, the 24 activations cast there. (The packed weights are fed as
    # inputs from the driver's blocks: onnxruntime's initializers lie outside them. The MatMul
    # weights are 2-D tiles, on the host fallback: their decode in Triton's interpreter
    # would take minutes; test above.)
    case = dict(model="minilm", weights="int8_e8m0_t8_t4", activations="mxfp8e4", fuse=True,
                recipe={"op_type_overrides": {"Gather": {"weights": "mxfp4"}}},
                packed_inputs=True)  # fmt: skip
    result, log = _model_on_cuda_kernels(fake_driver, case, tmp_path)
    kinds = _kinds(result["kernels"])
    assert kinds.count("gather") == 3 * 2, kinds  # codes and scales of each table
    assert kinds.count("dq") + kinds.count("dqi") == 3, kinds
    assert kinds.count("f") + kinds.count("q") == 24, kinds
    warnings = [ln for ln in log.splitlines() if "with host copies" in ln]
    assert len(warnings) == 18 and not [w for w in warnings if "GatherMX" in w], warnings


def test_the_bfp16_deployment_recipe_with_blocks_of_8_runs_on_the_cuda_kernels(
    fake_driver: Path, tmp_path: Path
) -> None:
    # `--preset bfp16-deploy --block-size 8` (int8_e8m0_t8, the BFP16 other tools use): every
    # activation on the kernels (none on the host fallback), the fast one where the tiled
    # axis is a multiple of 8 (the hidden size, the keys' head dim along axis 2; not the
    # 18-token axis of the attention probabilities)
    case = dict(
        model="minilm", preset="bfp16-deploy", block_size=8, fuse=True, weight_storage="fake"
    )
    result, log = _model_on_cuda_kernels(fake_driver, case, tmp_path)
    symbols = result["kernels"]
    assert all("int8_e8m0_t8" in k for k in symbols if k[0] == "f"), symbols
    kinds = _kinds(symbols)
    assert kinds.count("f") + kinds.count("q") == 24 and kinds.count("f") >= 12, kinds
    assert [ln for ln in log.splitlines() if "with host copies" in ln] == []


def test_a_cnn_on_the_cuda_provider_kernels_gives_the_cpu_bits(
    fake_driver: Path, tmp_path: Path
) -> None:
    # PP-OCRv4's direction classifier (NCHW convolutions, batch 2): activations tiled along
    # the channels, on the fast INNER values kernel where the channels are whole tiles and on
    # the general LAST=False compile elsewhere, none on the host fallback
    case = dict(
        model="ppocrv4_cls", weights="bfp16", activations="mxfp8e4", fuse=True,
        weight_storage="fake",
    )  # fmt: skip
    result, log = _model_on_cuda_kernels(fake_driver, case, tmp_path)
    ops = [k.split("_")[0] for k in result["kernels"]]
    assert ops.count("f21") >= 5 and ops.count("q14") >= 5, ops
    assert [ln for ln in log.splitlines() if "with host copies" in ln] == []
