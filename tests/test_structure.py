"""The shape of the source tree: small modules, short functions, one-way imports.

These are the limits the project keeps so that each file has one job (docs/architecture.md):
no Python module over 700 lines, no C++ source over 900, no function (kernels included) over
120 lines, no import cycle between onnxq modules, and every module importable on its own.
"""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "onnxq"
CXX_DIR = ROOT / "ops" / "src"
MAX_MODULE_LINES = 700
MAX_CXX_LINES = 900
MAX_FUNCTION_LINES = 120


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _cxx_sources() -> list[Path]:
    return sorted(p for p in CXX_DIR.rglob("*") if p.suffix in (".cc", ".h", ".inc", ".cu", ".cuh"))


def test_no_python_module_is_over_the_limit() -> None:
    long = {
        name: n
        for name, p in _modules().items()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_no_cxx_source_is_over_the_limit() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in _cxx_sources()}
    long = {name: n for name, n in sizes.items() if n > MAX_CXX_LINES}
    assert not long, f"C++ sources over {MAX_CXX_LINES} lines: {long}"


def test_no_python_function_is_over_the_limit() -> None:
    long = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name} ({lines})")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def _strip_cxx(text: str) -> str:
    """The source with comments, string and character literals blanked, newlines kept."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


_CONTAINER = re.compile(r"\b(namespace|struct|class|enum|union)\b|\bextern\s*$")


def cxx_function_lengths(text: str) -> list[tuple[int, int]]:
    """(first line, line count) of every function body, found by brace matching.

    A brace opens a function when it is not inside another function, its header (the text since
    the last ``;``, ``{`` or ``}``) has a parameter list, and the header is not a namespace,
    class or aggregate initializer. Lambdas and blocks inside a function count as the function's.
    """
    code = _strip_cxx(text)
    code = re.sub(r"^[ \t]*#[^\n]*", "", code, flags=re.M)  # preprocessor lines
    found: list[tuple[int, int]] = []
    stack: list[str] = []  # "container", "function", "block" for each open brace
    header_start = 0
    start_line = 0
    for i, ch in enumerate(code):
        if ch == "{":
            header = code[header_start:i]
            if "function" in stack:
                kind = "block"
            elif _CONTAINER.search(header):
                kind = "container"
            elif "(" in header and not header.rstrip().endswith("="):
                kind = "function"
                start_line = code.count("\n", 0, i) + 1
            else:
                kind = "block"
            stack.append(kind)
            header_start = i + 1
        elif ch == "}":
            kind = stack.pop() if stack else "block"
            if kind == "function" and "function" not in stack:
                end_line = code.count("\n", 0, i) + 1
                found.append((start_line, end_line - start_line + 1))
            header_start = i + 1
        elif ch == ";":
            header_start = i + 1
    return found


def test_the_cxx_function_scanner_sees_functions() -> None:
    body = "\n".join(["  x += 1;"] * 130)
    text = (
        "namespace a {\nstruct S { int f(int y) {\n return y; } };\n"
        f"static int g(int x) {{\n  if (x) {{ x = 2; }}\n{body}\n  return x;\n}}\n"
        "const int t[] = {1, 2};\n}\n"
    )
    lengths = cxx_function_lengths(text)
    assert [n for _, n in lengths] == [2, 134]


def test_no_cxx_function_is_over_the_limit() -> None:
    long = []
    for path in _cxx_sources():
        for line, count in cxx_function_lengths(path.read_text()):
            if count > MAX_FUNCTION_LINES:
                long.append(f"{path.name}:{line} ({count})")
    assert not long, f"C++ functions over {MAX_FUNCTION_LINES} lines: {long}"


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The onnxq modules that ``name`` imports anywhere in its body (lazy imports included)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def test_onnxq_modules_import_one_way() -> None:
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    # A package importing its own submodules is how packages export; only other edges count.
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    cycles = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("name", sorted(_modules()))
def test_each_module_imports_alone(name: str) -> None:
    if name.startswith("onnxq.cast.triton") or name in ("onnxq.cast.aot", "onnxq.cast.triton_pack"):
        pytest.importorskip("triton")
    run = subprocess.run(
        [sys.executable, "-c", f"import {name}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-2000:]
