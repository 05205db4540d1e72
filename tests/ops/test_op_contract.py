"""ops/gen_op_contract.py: the C++ op contract it generates is schemas.OPS, read without imports."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from onnxq.graph import schemas

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = ROOT / "ops" / "gen_op_contract.py"
SCHEMAS = ROOT / "onnxq" / "graph" / "schemas.py"


def _generator() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("gen_op_contract", GENERATOR)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected() -> dict[str, tuple[tuple[str, ...], ...]]:
    return {n: (s.inputs, s.outputs, s.attributes) for n, s in schemas.OPS.items()}


def _parse_header(text: str) -> dict[str, tuple[tuple[str, ...], ...]]:
    """The header's tables back as OpSpec fields (optional ports get their ``?`` again)."""

    def ports(name: str, which: str) -> tuple[str, ...]:
        body = re.search(rf"constexpr Port k{name}{which}\[\] = \{{(.*)\}};", text)
        assert body, f"no {which} table for {name}"
        pairs = re.findall(r'\{"([^"]+)", (true|false)\}', body.group(1))
        return tuple(n + ("?" if opt == "true" else "") for n, opt in pairs)

    ops = {}
    for name, n_in, n_out, n_attr in re.findall(
        r'\{"(\w+)", k\w+Inputs, (\d+), k\w+Outputs, (\d+), k\w+Attributes, (\d+)\}', text
    ):
        attrs = re.search(rf"constexpr const char\* k{name}Attributes\[\] = \{{(.*)\}};", text)
        assert attrs, f"no attribute table for {name}"
        names = tuple(re.findall(r'"(\w+)"', attrs.group(1)))
        fields = (ports(name, "Inputs"), ports(name, "Outputs"), names)
        assert tuple(map(len, fields)) == (int(n_in), int(n_out), int(n_attr)), name
        ops[name] = fields
    return ops


def test_the_generator_reads_ops_as_schemas_defines_it() -> None:
    assert _generator().read_ops(SCHEMAS) == _expected()


def test_the_generated_header_is_the_contract(tmp_path: Path) -> None:
    out = tmp_path / "generated" / "onnxq_op_contract.h"
    # As the build runs it: a fresh interpreter, nothing of onnxq or onnx imported.
    script = (
        "import sys; sys.argv = ['gen', sys.argv[1], sys.argv[2]]; "
        f"exec(open({str(GENERATOR)!r}).read()); "
        "assert not any(m == 'onnx' or m.startswith(('onnx.', 'onnxq')) for m in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(SCHEMAS), str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert _parse_header(text) == _expected()
    assert list(_parse_header(text)) == list(schemas.OPS)  # the order the C++ OpKind follows
    assert f"constexpr size_t kOpCount = {len(schemas.OPS)};" in text


def test_the_generator_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    gen = _generator()
    bad = tmp_path / "schemas.py"
    bad.write_text("OPS = {}\n")
    with pytest.raises(ValueError, match="no `OPS"):
        gen.read_ops(bad)
    bad.write_text('OPS: dict = {"A": OpSpec("A", ("X",), ("Y",), attrs())}\n')
    with pytest.raises(ValueError, match="not a tuple of string literals"):
        gen.read_ops(bad)
    bad.write_text('OPS: dict = {"A": OpSpec("B", ("X",), ("Y",), ())}\n')
    with pytest.raises(ValueError, match="names another op"):
        gen.read_ops(bad)
