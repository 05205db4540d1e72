"""What to quantize and with which format: `Recipe` (the user's choice) and `QuantPlan`.

A recipe is frozen data (style.md items 9-10): default weight and activation data types, the
op types to quantize, per-op-type and per-node-name overrides, excluded nodes and modes. It
loads from YAML, JSON, a mapping or another recipe, and validates every key and format when
loaded; patterns are checked against a model by `Recipe.check_nodes`. The graph pass
(`onnxq.graph.quantize`) first turns a recipe and a model into a `QuantPlan` (tensor ->
data type, axis, reason; `onnxq.graph.plan`, re-exported here) and then materialises it.

Recipe schema (YAML; JSON is the same structure)::

    weights: mxfp4              # default weight data type (preset or code); null = none
    activations: mxfp8e4        # default activation data type; null = none
    round_mode: even            # even, away, zero, stochastic
    scale_mode: floor           # floor, ceil, midmax, option3, topbinade, rceil, even, search
                                # (weights and activations; unset: see below)
    weight_scale_mode: search   # weights only (beats scale_mode in the same layer)
    op_types: [MatMul, Gemm]    # replaces the default target op types
    add_op_types: [Conv]        # added to them
    remove_op_types: [Gather]   # removed from them
    exclude: ["head*"]          # node-name globs left in float
    op_type_overrides:          # per op type; a null format keeps that part float
      Conv: {weights: mxfp8e4, activations: null}
    node_overrides:             # per node-name glob (later patterns win)
      "layer0/*": {weights: mx6, weight_axis: 0, round_mode: away}
    custom_ops_only: false      # true: allow nodes with no standard-ONNX fallback
    fuse: true                  # default fusions (gather); all; [matmul_mx, gather];
                                # false: QuantizeMX -> DequantizeMX pairs, no fusions

Override keys: ``weights``, ``activations``, ``round_mode``, ``scale_mode``,
``weight_scale_mode``, ``weight_axis``, ``activation_axis`` (an axis replaces the reduction
axis the quantizer would choose).

Scale modes: weight scales are stored, so the quantizer may choose them; with no
``scale_mode`` or ``weight_scale_mode`` set, weights use `DEFAULT_WEIGHT_SCALE_MODE`
(``search``: per tile, the candidate scale with the least squared error; the measurements
behind this default are in docs/formats.md, "Scale modes"). Activations are quantized at run
time by a rule: ``floor`` unless ``scale_mode`` names another rule (``search`` names none, so
activations keep ``floor`` under it). A later layer (op type, then node overrides) replaces
an earlier one's choice; within a layer ``weight_scale_mode`` beats ``scale_mode`` for weights.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from onnxq.formats.datatype import DataType, datatype
from onnxq.formats.modes import RoundMode, ScaleMode
from onnxq.graph.fuse import fusion_names
from onnxq.graph.plan import (
    SUPPORTED_OP_TYPES,
    ActivationEntry,
    PlanEntry,
    QuantPlan,
    WeightEntry,
)

__all__ = [
    "DEFAULT_OP_TYPES",
    "DEFAULT_WEIGHT_SCALE_MODE",
    "KEEP_FLOAT",
    "SUPPORTED_OP_TYPES",
    "ActivationEntry",
    "Override",
    "PlanEntry",
    "QuantPlan",
    "Recipe",
    "WeightEntry",
    "deployment_presets",
    "deployment_recipe",
    "load_recipe",
]

# The op types a recipe may name are those of the op-role table (onnxq.graph.plan.ROLES).
DEFAULT_OP_TYPES = ("MatMul", "Gemm", "Conv", "ConvTranspose", "LSTM", "GRU", "RNN", "Gather")
# An override's format value that keeps the tensor in float (YAML/JSON null).
KEEP_FLOAT = "float"
# The weights' scale mode when the recipe sets none (docs/formats.md, "Scale modes"), and the
# activations' run-time rule.
DEFAULT_WEIGHT_SCALE_MODE = "search"
_ACTIVATION_SCALE_MODE = "floor"

_TOP_KEYS = (
    "weights",
    "activations",
    "round_mode",
    "scale_mode",
    "weight_scale_mode",
    "op_types",
    "add_op_types",
    "remove_op_types",
    "exclude",
    "op_type_overrides",
    "node_overrides",
    "custom_ops_only",
    "fuse",
)


def _fuse(value: Any, where: str) -> bool | str | tuple[str, ...]:
    """A recipe's ``fuse``: true, false, ``all``, or fusion names (a list or comma string)."""
    if isinstance(value, bool):
        return value
    names = fusion_names(value, where)  # ValueError in one line naming the known fusions
    return "all" if isinstance(value, str) and value.strip() == "all" else names


def _fuse_value(fuse: bool | str | tuple[str, ...]) -> bool | str | list[str]:
    """``fuse`` as the recipe writes it (a list for names)."""
    return list(fuse) if isinstance(fuse, tuple) else fuse


_OVERRIDE_KEYS = (
    "weights",
    "activations",
    "round_mode",
    "scale_mode",
    "weight_scale_mode",
    "weight_axis",
    "activation_axis",
)


def _format(value: Any, where: str) -> DataType | None:
    """A data type from a preset/code string or a DataType; None stays None."""
    if value is None or isinstance(value, DataType):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a format name or code, got {value!r}")
    try:
        return datatype(value)
    except ValueError as err:
        raise ValueError(f"{where}: unknown format {value!r} ({err})") from None


def _mode(kind: type[RoundMode] | type[ScaleMode], value: Any, where: str) -> str | None:
    if value is None:
        return None
    try:
        return str(kind.parse(value).value)
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def _axis(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where}: expected an integer axis, got {value!r}")
    return value


def _check_keys(data: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ValueError(
            f"{where}: unknown key {unknown[0]!r}; expected one of {', '.join(allowed)}"
        )


def _op_types(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise ValueError(f"{where}: expected a list of op types, got {value!r}")
    if not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected a list of op type names (strings)")
    ops = tuple(value)
    for op in ops:
        if op not in SUPPORTED_OP_TYPES:
            raise ValueError(
                f"{where}: op type {op!r} is not supported; expected one of "
                f"{', '.join(SUPPORTED_OP_TYPES)}"
            )
    return ops


@dataclasses.dataclass(frozen=True, kw_only=True)
class Override:
    """Choices for the nodes an op type or name pattern selects; None inherits.

    ``weights``/``activations`` of `KEEP_FLOAT` keep that part of the node in float.
    """

    weights: DataType | str | None = None
    activations: DataType | str | None = None
    round_mode: str | None = None
    scale_mode: str | None = None
    weight_axis: int | None = None
    activation_axis: int | None = None
    weight_scale_mode: str | None = None

    @classmethod
    def from_mapping(cls, data: Any, where: str) -> Override:
        """Parse one override mapping (a null format becomes `KEEP_FLOAT`).

        Raises:
            ValueError: not a mapping, an unknown key, format or mode, naming ``where``.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a mapping of {', '.join(_OVERRIDE_KEYS)}")
        _check_keys(data, _OVERRIDE_KEYS, where)

        def fmt(key: str) -> DataType | str | None:
            if key not in data:
                return None
            if data[key] is None or data[key] == KEEP_FLOAT:
                return KEEP_FLOAT
            return _format(data[key], f"{where}.{key}")

        return cls(
            weights=fmt("weights"),
            activations=fmt("activations"),
            round_mode=_mode(RoundMode, data.get("round_mode"), f"{where}.round_mode"),
            scale_mode=_mode(ScaleMode, data.get("scale_mode"), f"{where}.scale_mode"),
            weight_scale_mode=_mode(
                ScaleMode, data.get("weight_scale_mode"), f"{where}.weight_scale_mode"
            ),
            weight_axis=_axis(data.get("weight_axis"), f"{where}.weight_axis"),
            activation_axis=_axis(data.get("activation_axis"), f"{where}.activation_axis"),
        )

    def to_dict(self) -> dict[str, Any]:
        """The mapping `from_mapping` parses back (set fields only)."""
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is None:
                continue
            out[field.name] = None if value == KEEP_FLOAT else str(value)
            if isinstance(value, int):
                out[field.name] = value
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recipe:
    """What the graph pass quantizes (see the module doc for the YAML schema).

    Attributes:
        weights: default weight data type; None quantizes no weights.
        activations: default activation data type; None quantizes no activations.
        round_mode: element rounding (`RoundMode` value).
        scale_mode: scale selection (`ScaleMode` value) of weights and activations; None:
            weights `DEFAULT_WEIGHT_SCALE_MODE`, activations ``floor``.
        weight_scale_mode: the weights' scale selection, beating ``scale_mode``; None: as
            ``scale_mode`` says.
        op_types: the target op types.
        exclude: node-name globs kept in float.
        op_type_overrides: per op type choices.
        node_overrides: per node-name glob choices, applied in order after op-type ones.
        custom_ops_only: allow a model that runs only with the onnxq custom-op library
            (nodes with no standard-ONNX fallback); see `onnxq.quantize_model`.
        fuse: which fusions run, as ``quantize_model(fuse=...)``: True (the default ones),
            ``"all"``, or a tuple of names (onnxq.graph.fuse); False quantizes activations with
            QuantizeMX -> DequantizeMX pairs and runs no fusion (``--no-fuse``).
    """

    weights: DataType | None = None
    activations: DataType | None = None
    round_mode: str = "even"
    scale_mode: str | None = None
    op_types: tuple[str, ...] = DEFAULT_OP_TYPES
    exclude: tuple[str, ...] = ()
    op_type_overrides: tuple[tuple[str, Override], ...] = ()
    node_overrides: tuple[tuple[str, Override], ...] = ()
    custom_ops_only: bool = False
    fuse: bool | str | tuple[str, ...] = True
    weight_scale_mode: str | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], where: str = "recipe") -> Recipe:
        """Parse and validate a recipe mapping.

        Raises:
            ValueError: an unknown key, format, mode or op type, naming it.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a mapping, got {type(data).__name__}")
        _check_keys(data, _TOP_KEYS, where)
        ops = list(_op_types(data.get("op_types", DEFAULT_OP_TYPES), f"{where}.op_types"))
        for op in _op_types(data.get("add_op_types", ()), f"{where}.add_op_types"):
            if op not in ops:
                ops.append(op)
        removed = _op_types(data.get("remove_op_types", ()), f"{where}.remove_op_types")
        ops = [op for op in ops if op not in removed]
        exclude = data.get("exclude", ())
        if isinstance(exclude, str) or not isinstance(exclude, Iterable):
            raise ValueError(f"{where}.exclude: expected a list of node-name patterns")
        if not all(isinstance(p, str) for p in exclude):
            raise ValueError(f"{where}.exclude: expected node-name patterns (strings)")
        custom_ops_only = data.get("custom_ops_only", False)
        if not isinstance(custom_ops_only, bool):
            raise ValueError(
                f"{where}.custom_ops_only: expected true or false, got {custom_ops_only!r}"
            )
        fuse = _fuse(data.get("fuse", True), f"{where}.fuse")

        def overrides(key: str, ops_only: bool) -> tuple[tuple[str, Override], ...]:
            table = data.get(key) or {}
            if not isinstance(table, Mapping):
                raise ValueError(f"{where}.{key}: expected a mapping of name -> override")
            if ops_only:
                _op_types(list(table), f"{where}.{key}")
            return tuple(
                (str(k), Override.from_mapping(v, f"{where}.{key}[{k!r}]"))
                for k, v in table.items()
            )

        return cls(
            weights=_format(data.get("weights"), f"{where}.weights"),
            activations=_format(data.get("activations"), f"{where}.activations"),
            round_mode=_mode(RoundMode, data.get("round_mode", "even"), f"{where}.round_mode")
            or "even",
            scale_mode=_mode(ScaleMode, data.get("scale_mode"), f"{where}.scale_mode"),
            weight_scale_mode=_mode(
                ScaleMode, data.get("weight_scale_mode"), f"{where}.weight_scale_mode"
            ),
            op_types=tuple(ops),
            exclude=tuple(str(p) for p in exclude),
            op_type_overrides=overrides("op_type_overrides", True),
            node_overrides=overrides("node_overrides", False),
            custom_ops_only=custom_ops_only,
            fuse=fuse,
        )

    def sets_a_format(self) -> bool:
        """True when some weight or activation gets a format (by default or an override)."""
        layers = [o for _, o in (*self.op_type_overrides, *self.node_overrides)]
        values = [self.weights, self.activations]
        values += [v for o in layers for v in (o.weights, o.activations)]
        return any(v is not None and v != KEEP_FLOAT for v in values)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping that `from_mapping` parses back to an equal recipe."""
        return {
            "weights": None if self.weights is None else self.weights.name,
            "activations": None if self.activations is None else self.activations.name,
            "round_mode": self.round_mode,
            **({"scale_mode": self.scale_mode} if self.scale_mode is not None else {}),
            **(
                {"weight_scale_mode": self.weight_scale_mode}
                if self.weight_scale_mode is not None
                else {}
            ),
            "op_types": list(self.op_types),
            "exclude": list(self.exclude),
            "op_type_overrides": {k: v.to_dict() for k, v in self.op_type_overrides},
            "node_overrides": {k: v.to_dict() for k, v in self.node_overrides},
            **({"custom_ops_only": True} if self.custom_ops_only else {}),
            **({} if self.fuse is True else {"fuse": _fuse_value(self.fuse)}),
        }

    def to_json(self) -> str:
        """The recipe as compact JSON (recorded in the quantized model's metadata)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def check_nodes(self, names: Iterable[str]) -> None:
        """Check that every exclude and node-override pattern matches a node of the model.

        Raises:
            ValueError: a pattern matches no node (a plain name: the node does not exist).
        """
        all_names = [n for n in names if n]
        for key, patterns in (
            ("exclude", self.exclude),
            ("node_overrides", tuple(p for p, _ in self.node_overrides)),
        ):
            for pattern in patterns:
                if any(fnmatch.fnmatchcase(n, pattern) for n in all_names):
                    continue
                if any(ch in pattern for ch in "*?["):
                    raise ValueError(f"recipe {key} pattern {pattern!r} matches no node")
                raise ValueError(f"recipe {key}: node {pattern!r} does not exist in the model")

    def resolve(self, op_type: str, node_name: str) -> Override | None:
        """The effective choices for one node, or None when it is not a target.

        Returns:
            An `Override` with every field decided: formats (None = keep float), modes
            (``scale_mode`` the activations', ``weight_scale_mode`` the weights'; module doc)
            and axes (None = the op's reduction axis).
        """
        if op_type not in self.op_types:
            return None
        if node_name and any(fnmatch.fnmatchcase(node_name, p) for p in self.exclude):
            return None
        chosen: dict[str, Any] = {
            "weights": self.weights,
            "activations": self.activations,
            "round_mode": self.round_mode,
            "scale_mode": self.scale_mode,
            "weight_scale_mode": self.weight_scale_mode or self.scale_mode,
            "weight_axis": None,
            "activation_axis": None,
        }
        layers = [o for k, o in self.op_type_overrides if k == op_type]
        layers += [
            o for p, o in self.node_overrides if node_name and fnmatch.fnmatchcase(node_name, p)
        ]
        for layer in layers:
            for field in dataclasses.fields(layer):
                value = getattr(layer, field.name)
                if value is not None:
                    chosen[field.name] = value
            if layer.weight_scale_mode is None and layer.scale_mode is not None:
                chosen["weight_scale_mode"] = layer.scale_mode  # this layer's, for weights too
        for key in ("weights", "activations"):
            if chosen[key] == KEEP_FLOAT:
                chosen[key] = None
        # Activations keep a run-time rule; `search` (stored scales only) names none.
        if chosen["scale_mode"] in (None, ScaleMode.SEARCH.value):
            chosen["scale_mode"] = _ACTIVATION_SCALE_MODE
        chosen["weight_scale_mode"] = chosen["weight_scale_mode"] or DEFAULT_WEIGHT_SCALE_MODE
        return Override(**chosen)


_MAX_RECIPE_BYTES = 1 << 20  # recipes are a few lines; anything bigger is the wrong file


def load_recipe(source: str | os.PathLike[str] | Mapping[str, Any] | Recipe) -> Recipe:
    """Load a recipe from a YAML or JSON file, a mapping or a `Recipe`.

    Raises:
        ValueError: a missing or unreadable file, bad YAML/JSON, or an invalid recipe (the
            message names the file and the key).
        TypeError: ``source`` has another type.
    """
    if isinstance(source, Recipe):
        return source
    if isinstance(source, Mapping):
        return Recipe.from_mapping(source)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"recipe must be a path, a mapping or a Recipe, not {type(source).__name__}"
        )
    path = Path(source)
    if not path.is_file():
        raise ValueError(f"recipe file {str(path)!r} does not exist or is not a file")
    expected = "a recipe is a YAML or JSON text file such as `weights: mxfp4`"
    if path.stat().st_size > _MAX_RECIPE_BYTES:
        raise ValueError(
            f"recipe file {str(path)!r} is {path.stat().st_size:,} bytes, over the "
            f"{_MAX_RECIPE_BYTES:,} a recipe may have; {expected}"
        )
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ValueError(f"recipe file {str(path)!r} cannot be read ({err.strerror})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(
            f"recipe file {str(path)!r} is not text (byte 0x{raw[err.start]:02x} at offset "
            f"{err.start} is not UTF-8); {expected}"
        ) from None
    if "\0" in text:
        raise ValueError(f"recipe file {str(path)!r} is not text (it holds NUL bytes); {expected}")
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as err:  # yaml.YAMLError / json.JSONDecodeError
        raise ValueError(f"recipe file {str(path)!r} is not valid YAML/JSON: {err}") from None
    if data is None:
        raise ValueError(f"recipe file {str(path)!r} is empty; {expected}")
    if not isinstance(data, Mapping):
        raise ValueError(
            f"recipe file {str(path)!r} holds a {type(data).__name__}, not a mapping of recipe "
            f"keys; {expected}"
        )
    return Recipe.from_mapping(data, where=f"recipe {path.name}")


# -- deployment presets ----------------------------------------------------------------------
_BFP16_CODE = "int8_e8m0_t16"


def deployment_presets() -> dict[str, Path]:
    """The named deployment recipes shipped with onnxq, by name, with their YAML files.

    The files live in the package's ``recipes`` folder (``bfp16-deploy``, ``mx6-deploy``,
    ``mx9-deploy``, ``mxfp8-deploy``); copy one, edit it and load it with `load_recipe`.

    Returns:
        Preset name -> path of its YAML file, sorted by name.
    """
    folder = Path(__file__).resolve().parent.parent / "recipes"
    return {f.stem: f for f in sorted(folder.glob("*.yaml"))}


def _with_block(value: Any, block_size: int) -> Any:
    if isinstance(value, DataType) and value.code == _BFP16_CODE:
        return datatype(f"int8_e8m0_t{block_size}")
    return value


def deployment_recipe(name: str, block_size: int | None = None) -> Recipe:
    """Load a named deployment recipe, optionally with another BFP16 block size.

    Args:
        name: a preset of `deployment_presets` (``bfp16-deploy``, ``mx6-deploy``, ...).
        block_size: replaces the block of every BFP16 format in the recipe
            (``int8_e8m0_t16`` -> ``int8_e8m0_t<block_size>``; 8 is the variant other BFP16
            tools use); a power of two from 2 to 1024.

    Returns:
        The validated `Recipe`.

    Raises:
        ValueError: an unknown preset, a bad block size, or a block size for a preset that
            has no BFP16 format.
    """
    presets = deployment_presets()
    if name not in presets:
        raise ValueError(
            f"unknown deployment preset {name!r}; expected one of {', '.join(presets)}"
        )
    recipe = load_recipe(presets[name])
    if block_size is None:
        return recipe
    if (
        isinstance(block_size, bool)
        or not isinstance(block_size, int)
        or not 2 <= block_size <= 1024
        or block_size & (block_size - 1)
    ):
        raise ValueError(
            f"block size {block_size!r}: expected a power of two from 2 to 1024 (e.g. 8, 16, 32)"
        )
    overrides = [o for _, o in recipe.op_type_overrides + recipe.node_overrides]
    formats = [recipe.weights, recipe.activations]
    formats += [f for o in overrides for f in (o.weights, o.activations)]
    if not any(isinstance(f, DataType) and f.code == _BFP16_CODE for f in formats):
        raise ValueError(
            f"block size {block_size}: preset {name!r} has no BFP16 format to resize "
            "(only the bfp16 presets take a block size)"
        )

    def resized(table: tuple[tuple[str, Override], ...]) -> tuple[tuple[str, Override], ...]:
        return tuple(
            (
                key,
                dataclasses.replace(
                    o,
                    weights=_with_block(o.weights, block_size),
                    activations=_with_block(o.activations, block_size),
                ),
            )
            for key, o in table
        )

    return dataclasses.replace(
        recipe,
        weights=_with_block(recipe.weights, block_size),
        activations=_with_block(recipe.activations, block_size),
        op_type_overrides=resized(recipe.op_type_overrides),
        node_overrides=resized(recipe.node_overrides),
    )
