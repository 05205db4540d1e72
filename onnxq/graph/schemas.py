"""ONNX schemas of the onnxq ops (domain ``onnxq``, version 1; contract in docs/ops.md).

`register_schemas` adds them to ONNX's schema registry, so ``onnx.checker.check_model`` and
``onnx.shape_inference.infer_shapes`` accept models that use the ops. `output_types` derives
every output's element type (and its shape, when the input shapes are known) from the
``dtype``, ``axis``, ``shape`` and ``output_type`` attributes. onnxruntime cannot infer those
types for custom ops (they depend on attributes), so `onnxq.runtime.session` writes them into
the model with `infer_shapes` before creating the session.

onnx 1.19 and later take a Python inference function on a schema; onnx's registry is a C++
static that outlives the interpreter, so the schemas are deregistered at exit (otherwise the
process hangs or crashes in onnx's static destructors). Older onnx releases cannot take one:
there the schemas are registered without it and `infer_shapes` writes the onnxq outputs'
types itself.

`OPS` is the table of the ops, inputs and outputs, the one statement of the op contract in
Python: `input_names`, `output_names`, `input_index` and `output_index` read names and
positions from it for the function fallbacks and the exporter. tests/ops/test_custom_ops.py runs
each op through the C++ library to check that the library registers the same ops.
"""

from __future__ import annotations

import atexit
import dataclasses
import math
from typing import Any

import onnx
from onnx import TensorProto, numpy_helper
from onnx.defs import OpSchema

from onnxq.cast.layout import Tiling
from onnxq.formats.codebook import Codebook
from onnxq.formats.datatype import DataType, datatype
from onnxq.graph.walk import walk_graphs

__all__ = [
    "DOMAIN",
    "OPS",
    "VERSION",
    "OpSpec",
    "infer_shapes",
    "input_index",
    "input_names",
    "output_index",
    "output_names",
    "output_types",
    "register_schemas",
]

DOMAIN = "onnxq"
VERSION = 1
_FLOATS = ("tensor(float)", "tensor(float16)", "tensor(bfloat16)")
_CODES = ("tensor(uint8)", "tensor(uint16)", "tensor(uint32)")
_OUTPUT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op: its inputs and outputs (a trailing ``?`` marks optional ones) and attributes."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[str, ...]


OPS: dict[str, OpSpec] = {
    "QuantizeMX": OpSpec(
        "QuantizeMX",
        ("X",),
        ("Q", "Scale?", "Zero?", "TenScale?", "Meta?", "Mask?"),
        ("dtype", "axis", "round_mode", "scale_mode", "nan_policy", "seed", "int_range"),
    ),
    "DequantizeMX": OpSpec(
        "DequantizeMX",
        ("Q", "Scale?", "Zero?", "TenScale?", "Meta?", "Mask?", "Shape?"),
        ("Y",),
        ("dtype", "axis", "shape", "output_type"),
    ),
    "CodebookLookup": OpSpec(
        "CodebookLookup",
        ("Q", "Meta", "Scale", "Table?"),
        ("Y",),
        ("dtype", "axis", "shape", "output_type"),
    ),
    "QuantizeDequantizeMX": OpSpec(
        "QuantizeDequantizeMX",
        ("X",),
        ("Y",),
        ("dtype", "axis", "round_mode", "scale_mode", "nan_policy", "seed", "int_range"),
    ),
    "MatMulMX": OpSpec(
        "MatMulMX",
        ("A", "Q", "Scale?", "Zero?", "TenScale?", "Meta?", "Mask?", "Bias?"),
        ("Y",),
        ("dtype", "axis", "shape", "output_type", "trans_b"),
    ),
    "GatherMX": OpSpec(
        "GatherMX",
        ("Indices", "Q", "Scale?", "Zero?", "TenScale?", "Meta?", "Mask?", "Table?"),
        ("Y",),
        ("dtype", "axis", "shape", "output_type"),
    ),
}


def input_names(op_type: str) -> tuple[str, ...]:
    """The op's input names in position order, without the ``?`` of optional ones."""
    return tuple(n.rstrip("?") for n in OPS[op_type].inputs)


def output_names(op_type: str) -> tuple[str, ...]:
    """The op's output names in position order, without the ``?`` of optional ones."""
    return tuple(n.rstrip("?") for n in OPS[op_type].outputs)


def input_index(op_type: str, name: str) -> int:
    """The position of input ``name`` (``?`` not included) in the op's inputs."""
    return input_names(op_type).index(name)


def output_index(op_type: str, name: str) -> int:
    """The position of output ``name`` (``?`` not included) in the op's outputs."""
    return output_names(op_type).index(name)


_TYPES: dict[str, tuple[str, tuple[str, ...]]] = {  # type constraint of each input / output name
    "X": ("T", _FLOATS),
    "Y": ("T", _FLOATS),
    "A": ("T", _FLOATS),
    "Bias": ("T", _FLOATS),
    "Q": ("B", ("tensor(uint8)",)),
    "Meta": ("B", ("tensor(uint8)",)),
    "Mask": ("B", ("tensor(uint8)",)),
    "Scale": ("S", _CODES),
    "Zero": ("Z", _CODES),
    "TenScale": ("G", _CODES),
    "Table": ("F", ("tensor(float)",)),
    "Shape": ("I", ("tensor(int64)",)),
    "Indices": ("Tind", ("tensor(int32)", "tensor(int64)")),
}
_ATTRS: dict[str, tuple[OpSchema.AttrType, Any, str]] = {
    "dtype": (OpSchema.AttrType.STRING, None, "preset or data type code (onnxq.datatype)"),
    "axis": (OpSchema.AttrType.INT, -1, "the axis 1-D tiles run along"),
    "round_mode": (OpSchema.AttrType.STRING, "even", "even, away, zero or stochastic"),
    "scale_mode": (OpSchema.AttrType.STRING, "floor", "floor, ceil, midmax, ... (ScaleMode)"),
    "nan_policy": (OpSchema.AttrType.STRING, "element", "element or block"),
    "seed": (OpSchema.AttrType.INT, 0, "stochastic rounding seed"),
    "int_range": (OpSchema.AttrType.STRING, "symmetric", "symmetric or full"),
    "shape": (OpSchema.AttrType.INTS, None, "the shape of X"),
    "output_type": (OpSchema.AttrType.INT, 1, "1 float, 10 float16, 16 bfloat16"),
    "trans_b": (OpSchema.AttrType.INT, 0, "MatMulMX: 1 when Q holds W = B^T, shape W's [N, K]"),
}
# Attributes with no default that an op may leave out: DequantizeMX's `shape`, when the Shape
# input gives X's shape at run time.
_OPTIONAL_ATTRS = {("DequantizeMX", "shape")}


def _code_type(bits: int) -> int:
    return (
        TensorProto.UINT8
        if bits <= 8
        else TensorProto.UINT16
        if bits <= 16
        else (TensorProto.UINT32)
    )


def _packed(count: int, bits: int) -> int:
    return (count * bits + 7) // 8


def _tiling_shapes(
    dt: DataType, shape: tuple[int, ...], axis: int
) -> tuple[tuple[int, ...], int, int | None]:
    """(tile grid shape, meta unit count, kept element count or None when data dependent)."""
    tiling = Tiling.build(shape, axis, dt.sspec)
    grid: tuple[int, ...] = (1,)
    if tiling.kind != "tensor":
        moved = tiling.moved_shape
        rows_cols = (tiling.nR, tiling.nC) if tiling.kind == "2d" else (tiling.nC,)
        moved_grid = (*moved[: len(moved) - len(rows_cols)], *rows_cols)
        grid = (*moved_grid[:axis], moved_grid[-1], *moved_grid[axis:-1])
    if tiling.Sc:
        rows, cols = tiling.sub_counts
        units = tiling.B * rows * cols
    else:
        units = 1 if tiling.kind == "tensor" else tiling.B * tiling.nR * tiling.nC
    count = math.prod(shape)
    kept: int | None = count
    if dt.sspec is not None and dt.sspec.sparsity[1]:
        kept = None  # pruned positions depend on the data
    return grid, units, kept


def output_types(
    op_type: str,
    attrs: dict[str, Any],
    input_shape: tuple[int, ...] | None = None,
    *,
    shape_input: bool = False,
    shape_value: tuple[int | None, ...] | None = None,
    input_type: int = 0,
) -> list[tuple[int, tuple[int, ...] | None]]:
    """Element type and shape (None when unknown) of each output of one node.

    Args:
        op_type: an op of `OPS`.
        attrs: the node's attributes as Python values (``dtype`` required).
        input_shape: X's shape for QuantizeMX and QuantizeDequantizeMX, A's for MatMulMX,
            Indices' for GatherMX, when known.
        shape_input: DequantizeMX: the node has the ``Shape`` input (X's shape at run time).
        shape_value: what is known of that input: its dims (``None`` for a dim not known
            before run time), or None when not even its length is known.
        input_type: QuantizeDequantizeMX: X's element type (Y's); 0 when unknown.

    Returns:
        One ``(TensorProto element type, shape or None)`` per output in `OPS` order; a type of
        0 marks an output the data type does not have. DequantizeMX's Y shape may hold None
        for a dim only its Shape input knows at run time.

    Raises:
        ValueError: unknown op, a bad dtype, axis, shape or output_type, or a DequantizeMX
            with neither the ``shape`` attribute nor the ``Shape`` input, or with both
            disagreeing (message starts with ``[op_type]``).
    """
    if op_type not in OPS:
        raise ValueError(f"unknown onnxq op {op_type!r}; expected one of {sorted(OPS)}")
    where = f"[{op_type}]"
    code = attrs.get("dtype")
    if not isinstance(code, str):
        raise ValueError(f"{where} attribute 'dtype' (a preset or data type code) is required")
    try:
        dt = datatype(code)
    except ValueError as err:
        raise ValueError(f"{where} dtype {code!r}: {err}") from None
    axis = int(attrs.get("axis", -1))
    s = dt.sspec
    if op_type == "QuantizeDequantizeMX":
        if isinstance(dt.nspec, Codebook):
            raise ValueError(
                f"{where} dtype {code!r} is a codebook: its decode is CodebookLookup; use the "
                "QuantizeMX -> CodebookLookup pair"
            )
        if input_shape is not None and not -len(input_shape) <= axis < len(input_shape):
            raise ValueError(f"{where} axis {axis} is out of range for X of {input_shape}")
        return [(input_type, input_shape)]
    if op_type == "QuantizeMX":
        nspec = dt.nspec
        meta_bits = nspec.meta_bits if isinstance(nspec, Codebook) else 1
        has_meta = isinstance(nspec, Codebook) or (s is not None and s.subtile[1] > 0)
        grid = units = None
        q_shape: tuple[int, ...] | None = None
        if input_shape is not None:
            if not -len(input_shape) <= axis < len(input_shape):
                raise ValueError(f"{where} axis {axis} is out of range for X of {input_shape}")
            if 0 in input_shape:  # an empty X: Q is empty, the field shapes are left open
                q_shape = (0,)
            else:
                grid, units, kept = _tiling_shapes(dt, input_shape, axis % len(input_shape))
                q_shape = None if kept is None else (_packed(kept, nspec.bits),)
        count = None if input_shape is None else math.prod(input_shape)
        return [
            (TensorProto.UINT8, q_shape),
            (_code_type(s.scale.bits), grid) if s is not None else (0, None),
            (_code_type(s.zero.bits), grid) if s is not None and s.zero else (0, None),
            (_code_type(s.tenscale.bits), (1,)) if s is not None and s.tenscale else (0, None),
            (TensorProto.UINT8, None if units is None else (_packed(units, meta_bits),))
            if has_meta
            else (0, None),
            (TensorProto.UINT8, None if count is None else (_packed(count, 1),))
            if s is not None and s.sparsity[1]
            else (0, None),
        ]
    y_shape = _y_shape(op_type, attrs.get("shape"), shape_input, shape_value)
    out_type = int(attrs.get("output_type", TensorProto.FLOAT))
    if out_type not in _OUTPUT_TYPES:
        raise ValueError(
            f"{where} attribute 'output_type' {out_type} must be 1 (float), 10 (float16) or "
            f"16 (bfloat16)"
        )
    if op_type == "CodebookLookup" and not isinstance(dt.nspec, Codebook):
        raise ValueError(f"{where} dtype {code!r} is not a codebook; use DequantizeMX")
    if op_type == "MatMulMX":
        trans_b = int(attrs.get("trans_b", 0))
        return [_matmul_mx_output(list(y_shape or ()), out_type, input_shape, trans_b)]
    if op_type == "GatherMX":  # Indices.shape + the table's row shape
        table = tuple(y_shape or ())
        rows = None if input_shape is None else (*input_shape, *table[1:])
        return [(out_type, rows)]
    return [(out_type, y_shape)]  # type: ignore[list-item]


def _y_shape(
    op_type: str,
    attr: Any,
    shape_input: bool,
    shape_value: tuple[int | None, ...] | None,
) -> tuple[int | None, ...] | None:
    """Y's shape from the ``shape`` attribute and / or the ``Shape`` input (docs/ops.md)."""
    where = f"[{op_type}]"
    if attr is None and not (op_type == "DequantizeMX" and shape_input):
        fix = (
            " or the Shape input (int64, X's shape at run time)"
            if op_type == "DequantizeMX"
            else ""
        )
        raise ValueError(f"{where} X's shape is unknown: give the attribute 'shape'{fix}")
    given = None
    if attr is not None:
        given = tuple(int(d) for d in attr)
        if not given or any(d < 1 for d in given):
            fix = "; leave it out and feed the Shape input" if op_type == "DequantizeMX" else ""
            raise ValueError(
                f"{where} attribute 'shape' must hold X's positive dims, got {list(attr)}{fix}"
            )
    if not shape_input:
        return given
    runtime = (
        None if shape_value is None else tuple(None if d is None else int(d) for d in shape_value)
    )
    if runtime is not None:
        if not runtime:
            raise ValueError(f"{where} input Shape is empty; X has at least one dim")
        if any(d is not None and d < 0 for d in runtime):
            raise ValueError(f"{where} input Shape {list(runtime)} holds a negative dim")
    if given is None:
        return runtime
    if runtime is not None and (
        len(runtime) != len(given)
        or any(r is not None and r != g for r, g in zip(runtime, given, strict=False))
    ):
        raise ValueError(
            f"{where} attribute 'shape' {list(given)} and input Shape {list(runtime)} disagree; "
            "drop the attribute (the Shape input is X's shape at run time) or make them equal"
        )
    return given


def _matmul_mx_output(
    shape: list[int], out_type: int, a_shape: tuple[int, ...] | None, trans_b: int = 0
) -> tuple[int, tuple[int, ...] | None]:
    """MatMulMX's Y: float32, A's leading dims and N (`shape`: B's [K, N], W's with trans_b)."""
    if trans_b not in (0, 1):
        raise ValueError(
            f"[MatMulMX] attribute 'trans_b' {trans_b} must be 0 (Q holds B [K, N]) or 1 "
            "(Q holds W = B^T [N, K])"
        )
    if len(shape) != 2:
        what = "W's [N, K]" if trans_b else "B's [K, N]"
        raise ValueError(f"[MatMulMX] attribute 'shape' must be {what}, got {list(shape)}")
    if out_type != TensorProto.FLOAT:
        raise ValueError(
            f"[MatMulMX] attribute 'output_type' {out_type}: only 1 (float) is supported; "
            "decode float16/bfloat16 weights with DequantizeMX and MatMul"
        )
    k, n = (int(d) for d in (shape[::-1] if trans_b else shape))
    if a_shape is not None and (not a_shape or a_shape[-1] != k):
        raise ValueError(f"[MatMulMX] input A of shape {a_shape} must end in K = {k}")
    return out_type, None if a_shape is None else (*a_shape[:-1], n)


def _attr_value(value: Any) -> Any:
    if isinstance(value, onnx.AttributeProto):
        if value.type == onnx.AttributeProto.STRING:
            return value.s.decode()
        if value.type == onnx.AttributeProto.INT:
            return value.i
        if value.type == onnx.AttributeProto.INTS:
            return list(value.ints)
        return None
    return value.decode() if isinstance(value, bytes) else value


def _infer(op_type: str, ctx: onnx.shape_inference.InferenceContext) -> None:
    attrs: dict[str, Any] = {}
    for name in OPS[op_type].attributes:
        value = ctx.get_attribute(name)
        if value is not None:
            attrs[name] = _attr_value(value)
    if op_type == "GatherMX":
        _infer_gather(ctx, attrs)
        return
    input_shape = None
    if op_type == "QuantizeMX" and ctx.get_num_inputs() > 0:
        x = ctx.get_input_type(0)
        if x is not None and x.tensor_type.HasField("shape"):
            dims = x.tensor_type.shape.dim
            if all(d.HasField("dim_value") for d in dims) and dims:
                input_shape = tuple(d.dim_value for d in dims)
    if op_type == "MatMulMX":
        _infer_matmul_mx(ctx, attrs)
        return
    if op_type == "QuantizeDequantizeMX":
        _infer_qdq(attrs, ctx)
        return
    shape_input, shape_value = _shape_input(op_type, ctx)
    results = output_types(
        op_type, attrs, input_shape, shape_input=shape_input, shape_value=shape_value
    )
    for i, (elem, shape) in enumerate(results):
        if i >= ctx.get_num_outputs() or not elem or not ctx.has_output(i):
            continue
        t = onnx.TypeProto()
        t.tensor_type.elem_type = elem
        if shape is not None:
            t.tensor_type.shape.SetInParent()
            for d in shape:
                dim = t.tensor_type.shape.dim.add()
                if d is not None:
                    dim.dim_value = d
        ctx.set_output_type(i, t)


def _infer_qdq(attrs: dict[str, Any], ctx: onnx.shape_inference.InferenceContext) -> None:
    """QuantizeDequantizeMX: Y has X's type and shape, symbolic dims included."""
    x = ctx.get_input_type(0) if ctx.get_num_inputs() > 0 else None
    static = _static_shape(x)
    output_types("QuantizeDequantizeMX", attrs, static)  # checks dtype and axis
    if x is None or not x.tensor_type.elem_type or not ctx.has_output(0):
        return
    t = onnx.TypeProto()
    t.CopyFrom(x)
    ctx.set_output_type(0, t)


def _shape_input(
    op_type: str, ctx: onnx.shape_inference.InferenceContext
) -> tuple[bool, tuple[int | None, ...] | None]:
    """Whether the node has the Shape input, and what inference knows of its value."""
    if op_type != "DequantizeMX":
        return False, None
    slot = input_index(op_type, "Shape")
    if ctx.get_num_inputs() <= slot or not ctx.has_input(slot):
        return False, None
    data = ctx.get_input_data(slot)  # an initializer or a constant
    if data is not None:
        return True, tuple(int(v) for v in numpy_helper.to_array(data).reshape(-1))
    symbolic = ctx.get_symbolic_input(slot)  # Shape(X) under data propagation
    if symbolic is not None and len(symbolic.dim):
        return True, tuple(d.dim_value if d.HasField("dim_value") else None for d in symbolic.dim)
    t = ctx.get_input_type(slot)
    if t is not None and t.tensor_type.HasField("shape"):
        dims = t.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].HasField("dim_value"):
            return True, (None,) * dims[0].dim_value  # its length is X's rank
    return True, None


def _infer_matmul_mx(ctx: onnx.shape_inference.InferenceContext, attrs: dict[str, Any]) -> None:
    """Y's type, and A's leading dims (symbolic ones too) followed by N."""
    elem, _ = output_types("MatMulMX", attrs, None)[0]
    t = onnx.TypeProto()
    t.tensor_type.elem_type = elem
    a = ctx.get_input_type(0) if ctx.get_num_inputs() > 0 else None
    if a is not None and a.tensor_type.HasField("shape") and a.tensor_type.shape.dim:
        dims = a.tensor_type.shape.dim
        k, n = (int(d) for d in attrs["shape"])
        if int(attrs.get("trans_b", 0)):
            k, n = n, k
        if dims[-1].HasField("dim_value") and dims[-1].dim_value != k:
            raise onnx.shape_inference.InferenceError(  # a shape error, as onnx's own ops raise
                f"[MatMulMX] input A's last dim {dims[-1].dim_value} must be K = {k}"
            )
        t.tensor_type.shape.SetInParent()
        for d in dims[:-1]:
            t.tensor_type.shape.dim.add().CopyFrom(d)
        t.tensor_type.shape.dim.add().dim_value = n
    if ctx.get_num_outputs() > 0 and ctx.has_output(0):
        ctx.set_output_type(0, t)


def _infer_gather(ctx: onnx.shape_inference.InferenceContext, attrs: dict[str, Any]) -> None:
    """GatherMX's Y: Indices' dims (symbolic ones kept) followed by the table's row dims."""
    elem, _ = output_types("GatherMX", attrs)[0]
    t = onnx.TypeProto()
    t.tensor_type.elem_type = elem
    indices = ctx.get_input_type(0) if ctx.get_num_inputs() > 0 else None
    if indices is not None and indices.tensor_type.HasField("shape"):
        t.tensor_type.shape.SetInParent()
        for d in indices.tensor_type.shape.dim:
            t.tensor_type.shape.dim.add().CopyFrom(d)
        for d in list(attrs["shape"])[1:]:
            t.tensor_type.shape.dim.add().dim_value = int(d)
    if ctx.get_num_outputs() > 0 and ctx.has_output(0):
        ctx.set_output_type(0, t)


def _schema(spec: OpSpec) -> OpSchema:
    def param(name: str) -> OpSchema.FormalParameter:
        base = name.rstrip("?")
        option = (
            OpSchema.FormalParameterOption.Optional
            if name.endswith("?")
            else OpSchema.FormalParameterOption.Single
        )
        return OpSchema.FormalParameter(base, _TYPES[base][0], param_option=option)

    used = {_TYPES[n.rstrip("?")] for n in (*spec.inputs, *spec.outputs)}
    constraints = [(key, list(types), "") for key, types in sorted(used)]
    attributes = []
    for name in spec.attributes:
        kind, default, doc = _ATTRS[name]
        if default is None:
            required = (spec.name, name) not in _OPTIONAL_ATTRS
            attributes.append(OpSchema.Attribute(name, kind, doc, required=required))
        else:
            attributes.append(OpSchema.Attribute(name, _default_attr(name, default), doc))
    schema = OpSchema(
        spec.name,
        DOMAIN,
        VERSION,
        f"onnxq {spec.name} (docs/ops.md)",
        inputs=[param(n) for n in spec.inputs],
        outputs=[param(n) for n in spec.outputs],
        type_constraints=constraints,
        attributes=attributes,
    )
    if _PY_INFERENCE:
        schema.set_type_and_shape_inference_function(lambda ctx: _infer(spec.name, ctx))
    return schema


def _default_attr(name: str, value: Any) -> onnx.AttributeProto:
    attr = onnx.AttributeProto()
    attr.name = name
    if isinstance(value, str):
        attr.type = onnx.AttributeProto.STRING
        attr.s = value.encode()
    else:
        attr.type = onnx.AttributeProto.INT
        attr.i = int(value)
    return attr


# onnx 1.19 added Python inference functions on schemas (earlier: `_propagate` does the work).
_PY_INFERENCE = hasattr(OpSchema, "set_type_and_shape_inference_function")
_registered = False
_inferred_by_onnx = False  # the registered schemas carry `_infer`


def register_schemas() -> None:
    """Register the schemas of `OPS` with ONNX (once per process; later calls do nothing).

    Schemas that carry a Python inference function are deregistered at interpreter exit.
    """
    global _registered, _inferred_by_onnx
    if _registered:
        return
    mine = []
    for spec in OPS.values():
        try:
            onnx.defs.get_schema(spec.name, VERSION, DOMAIN)
        except onnx.defs.SchemaError:
            onnx.defs.register_schema(_schema(spec))
            mine.append(spec.name)
    if mine and _PY_INFERENCE:
        # Their inference functions are Python objects: free them while Python still runs.
        atexit.register(_deregister, mine)
    _inferred_by_onnx = _PY_INFERENCE and bool(mine)
    _registered = True


def _deregister(names: list[str]) -> None:
    for name in names:
        try:
            onnx.defs.deregister_schema(name, VERSION, DOMAIN)
        except onnx.defs.SchemaError:
            pass


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``onnx.shape_inference.infer_shapes`` that also types the outputs of onnxq nodes.

    On onnx releases without Python inference functions the onnxq outputs' types (and shapes,
    where X's shape is known) are written into ``value_info`` from `output_types`, and
    inference repeats until nothing new is learned, so standard ops downstream are typed too.

    Args:
        model: the model (not modified).

    Returns:
        The inferred copy.

    Raises:
        ValueError: an onnxq node has a bad ``dtype``, ``axis``, ``shape`` or
            ``output_type`` (on releases without Python inference functions).
    """
    register_schemas()
    if _inferred_by_onnx or not any(
        n.domain == DOMAIN for g in walk_graphs(model.graph) for n in g.node
    ):
        return onnx.shape_inference.infer_shapes(model)
    return _propagate(model)


def _static_shape(t: onnx.TypeProto | None) -> tuple[int, ...] | None:
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    dims = t.tensor_type.shape.dim
    if dims and all(d.HasField("dim_value") for d in dims):
        return tuple(d.dim_value for d in dims)
    return None


_SHAPED = ("QuantizeMX", "QuantizeDequantizeMX", "MatMulMX", "GatherMX")  # follow input 0


def _propagate(model: onnx.ModelProto) -> onnx.ModelProto:
    """`infer_shapes` for onnx releases whose schemas cannot carry `_infer`."""
    work = onnx.ModelProto()
    work.CopyFrom(model)
    nodes = [(g, n) for g in walk_graphs(work.graph) for n in g.node if n.domain == DOMAIN]
    typed: set[str] = set()
    last_pass = False  # QuantizeMX nodes whose X stays unknown get types without shapes
    while True:
        inferred = onnx.shape_inference.infer_shapes(work)
        known: dict[str, onnx.TypeProto | None] = {}
        for g in walk_graphs(inferred.graph):
            for v in (*g.input, *g.value_info, *g.output):
                if v.type.tensor_type.elem_type:
                    known[v.name] = v.type
            for t in g.initializer:
                known[t.name] = onnx.helper.make_tensor_type_proto(t.data_type, list(t.dims))
        added = False
        for graph, node in nodes:
            todo = [(i, o) for i, o in enumerate(node.output) if o and o not in typed]
            if not todo:
                continue
            x_type = known.get(node.input[0]) if node.input else None
            takes_x = node.op_type in _SHAPED
            if takes_x and _static_shape(x_type) is None and not last_pass:
                continue  # X's type, or its shape, may come from a later round
            attrs: dict[str, Any] = {}
            for a in node.attribute:
                attrs[a.name] = _attr_value(a)
            shape = _static_shape(x_type) if takes_x else None
            has_shape, shape_value = _shape_initializer(node, graph)
            results = output_types(
                node.op_type,
                attrs,
                shape,
                shape_input=has_shape,
                shape_value=shape_value,
                input_type=x_type.tensor_type.elem_type if x_type is not None else 0,
            )
            outputs = {v.name: v for v in graph.output}
            for i, name in todo:
                typed.add(name)
                elem, dims = results[i] if i < len(results) else (0, None)
                if not elem:
                    continue
                info = onnx.helper.make_tensor_value_info(name, elem, dims)
                if name in outputs:
                    if not outputs[name].type.tensor_type.elem_type:
                        outputs[name].type.CopyFrom(info.type)
                else:
                    graph.value_info.append(info)
                added = True
        if not added:
            if last_pass or all(o in typed for _, n in nodes for o in n.output if o):
                return inferred
            last_pass = True


def _shape_initializer(
    node: onnx.NodeProto, graph: onnx.GraphProto
) -> tuple[bool, tuple[int | None, ...] | None]:
    """`_shape_input` for `_propagate`: the Shape input's value when it is an initializer."""
    if node.op_type != "DequantizeMX":
        return False, None
    slot = input_index("DequantizeMX", "Shape")
    if len(node.input) <= slot or not node.input[slot]:
        return False, None
    for t in graph.initializer:
        if t.name == node.input[slot]:
            return True, tuple(int(v) for v in numpy_helper.to_array(t).reshape(-1))
    return True, None
