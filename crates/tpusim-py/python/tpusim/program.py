"""Reads the XLA program of a `jax.export` (its StableHLO) into a program description
(`crates/tpusim-program/PROGRAM.md`, format `tpusim-program-description`): values with shapes and
dtypes, ops in program order with their operands, results, attributes and source locations, the
collectives of `shard_map` bodies with their replica groups or source-target pairs, and each
`tpu_custom_call` referencing the kernel description of its Pallas kernel. Calls (`func.call`)
are inlined; `sdy.manual_computation` bodies (`shard_map`) are read with their per-device shapes
and marked `sharded`. Only reading: what an op costs is decided in Rust (crate `tpusim-program`).
"""

from __future__ import annotations

import re

from . import jax as tj

#: The program description format version this module writes (the Rust reader's `VERSION`).
PROGRAM_VERSION = 1

_TERMINATORS = {"func.return", "stablehlo.return", "sdy.return"}


def _shape_dtype(t):
    _, _, ir, _ = tj._ir()
    try:
        tt = ir.RankedTensorType(t)
        return [int(x) for x in tt.shape], str(tt.element_type)
    except Exception:
        return None, str(t)


def _dense(a):
    """A dense integer attribute as nested Python lists."""
    import numpy as np

    _, _, ir, _ = tj._ir()
    try:
        return np.array(ir.DenseIntElementsAttr(a)).tolist()
    except Exception:
        return np.array(ir.DenseElementsAttr(a)).tolist()


def _loc(op):
    """`file:LINE` of the innermost frame in an op's location outside this package (the user's
    line), or None when the location names no file (ops of a called function: the reader then
    gives the call site's)."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    for f, line in re.findall(r'"([^"]+)":(\d+)', str(op.location)):
        if not os.path.abspath(f).startswith(here + os.sep):
            return f"{os.path.basename(f)}:{line}"
    return None


def _dims_attr(s, key):
    m = re.search(key + r" = \[([0-9, ]*)\]", s)
    return [int(x) for x in m.group(1).split(",") if x.strip()] if m else []


class _ProgramReader:
    def __init__(self, module, kernel_ops):
        self.module = module
        self.funcs = {}
        for f in module.body.operations:
            if f.operation.name == "func.func":
                self.funcs[f.attributes["sym_name"].value] = f
        self.kernel_ops = kernel_ops
        self.values = []
        self.ops = []
        self.ids = {}
        self.depth = 0
        self.call_locs = []

    def _vid(self, v, kind="result"):
        key = v
        if key in self.ids:
            return self.ids[key]
        shape, dtype = _shape_dtype(v.type)
        if shape is None:
            raise tj.InputError(f"a value of type {v.type} (not a ranked tensor) in the program: not read")
        self.values.append({"shape": shape, "dtype": dtype, "kind": kind})
        self.ids[key] = len(self.values) - 1
        return self.ids[key]

    def _alias(self, v, vid):
        self.ids[v] = vid

    def _kernel_index(self, op):
        for i, k in enumerate(self.kernel_ops):
            if k.operation == op.operation:
                return i
        return None

    def read_block(self, block, sharded):
        """Ops of a block in order; returns the terminator's operand ids."""
        for o in block.operations:
            name = o.operation.name
            if name in _TERMINATORS:
                return [self.ids[x] if x in self.ids else self._vid(x) for x in o.operands]
            self.read_op(o, sharded)
        return []

    def read_op(self, o, sharded):
        _, _, ir, _ = tj._ir()
        name = o.operation.name
        loc = _loc(o) or (self.call_locs[-1] if self.call_locs else str(o.location))
        if name in ("func.call", "call"):
            callee = self.funcs.get(o.attributes["callee"].value)
            if callee is None or self.depth > 64:
                raise tj.InputError(f"{loc}: a call to {o.attributes['callee'].value}, which the export does not define")
            block = callee.regions[0].blocks[0]
            for a, x in zip(block.arguments, o.operands):
                self._alias(a, self._vid(x))
            self.depth += 1
            self.call_locs.append(loc)
            outs = self.read_block(block, sharded)
            self.call_locs.pop()
            self.depth -= 1
            for r, vid in zip(o.results, outs):
                self._alias(r, vid)
            return
        if name == "sdy.manual_computation":
            # The shard_map body: its arguments are the per-device shards of the operands.
            block = o.regions[0].blocks[0]
            operands = [self._vid(x) for x in o.operands]
            args = [self._vid(a, kind="shard") for a in block.arguments]
            self.ops.append({"op": "shard", "operands": operands, "results": args, "location": loc, "sharded": sharded, "attrs": {}})
            outs = self.read_block(block, True)
            results = [self._vid(r) for r in o.results]
            self.ops.append({"op": "unshard", "operands": outs, "results": results, "location": loc, "sharded": True, "attrs": {}})
            return
        if name in ("sdy.sharding_constraint", "stablehlo.optimization_barrier"):
            for r, x in zip(o.results, o.operands):
                self._alias(r, self._vid(x))
            return
        if name == "stablehlo.constant":
            self._vid(o.results[0], kind="constant")
            return
        short = name[len("stablehlo."):] if name.startswith("stablehlo.") else name
        operands = [self._vid(x) for x in o.operands]
        results = [self._vid(r) for r in o.results]
        attrs = self.attrs(o, short)
        self.ops.append({"op": short, "operands": operands, "results": results, "location": loc, "sharded": sharded, "attrs": attrs})

    def attrs(self, o, short):
        _, _, ir, _ = tj._ir()
        a = o.attributes
        out = {}
        if short == "dot_general":
            s = str(a["dot_dimension_numbers"])
            for k in ("lhs_batching_dimensions", "rhs_batching_dimensions", "lhs_contracting_dimensions", "rhs_contracting_dimensions"):
                out[k] = _dims_attr(s, k)
            if "precision_config" in a:
                out["precision"] = re.findall(r"precision<(\w+)>", str(a["precision_config"])) or [str(a["precision_config"])]
        elif short in ("reduce", "all_reduce", "reduce_scatter", "reduce_window", "scatter", "select_and_scatter"):
            body = [x.operation.name for blk in o.regions[0].blocks for x in blk.operations] if o.regions else []
            out["computation"] = [n[len("stablehlo."):] for n in body if n not in _TERMINATORS]
        if short == "reduce":
            out["dimensions"] = tj._ints(a["dimensions"])
        elif short == "transpose":
            out["permutation"] = tj._ints(a["permutation"])
        elif short == "broadcast_in_dim":
            out["broadcast_dimensions"] = tj._ints(a["broadcast_dimensions"])
        elif short == "custom_call":
            out["target"] = a["call_target_name"].value
            if out["target"] == "tpu_custom_call":
                k = self._kernel_index(o)
                if k is None:
                    raise tj.InputError(
                        f"{_loc(o)}: a tpu_custom_call whose kernel was not described (a kernel whose grid runs no step with these arguments is left out: "
                        "pass arguments for which every kernel of the program runs at least one grid step)"
                    )
                out["kernel"] = k
        if "replica_groups" in a:
            out["replica_groups"] = _dense(a["replica_groups"])
        if "source_target_pairs" in a:
            out["source_target_pairs"] = _dense(a["source_target_pairs"])
        for k in ("all_gather_dim", "scatter_dimension", "split_dimension", "concat_dimension", "split_count"):
            if k in a:
                out[k] = ir.IntegerAttr(a[k]).value
        if short == "compare" and "comparison_direction" in a:
            out["comparison_direction"] = str(a["comparison_direction"]).split()[-1].rstrip(">")
        return out


def _mesh_axes(module):
    """The `sdy.mesh` axes of the export: [[name, size], ...] (the first mesh), or []."""
    for o in module.body.operations:
        if o.operation.name == "sdy.mesh":
            return [[n, int(v)] for n, v in re.findall(r'"(\w+)"\s*=\s*(\d+)', str(o.attributes["mesh"]))]
    return []


def describe_program(fn, *args, chip="v6e", device_kind=None, mesh=None):
    """The program description (a dict, `crates/tpusim-program/PROGRAM.md`) of `fn(*args)`
    lowered for TPU under `chip`'s device kind (inside `mesh`, from `tpusim.jax.mesh`, when the
    function uses `shard_map`). Raises `InputError` when the function does not lower or holds a
    value that is not a ranked tensor."""
    exported = tj.lower(fn, *args, chip=chip, device_kind=device_kind, mesh=mesh)
    _, _, ir, _ = tj._ir()
    kind, _ = tj._device_kind(chip, device_kind)
    with tj._context(), ir.Location.unknown():
        module = ir.Module.parse(exported.mlir_module())
        kernels, _, kernel_ops = tj._kernels_of(module, args, lambda: tj._call_operands(fn, args, mesh if mesh is not None else tj._mesh_for(chip, device_kind)))
        reader = _ProgramReader(module, kernel_ops)
        main = reader.funcs.get("main")
        if main is None:
            raise tj.InputError("the export has no `main` function")
        block = main.regions[0].blocks[0]
        inputs = [reader._vid(a, kind="argument") for a in block.arguments]
        outputs = reader.read_block(block, False)
        axes = _mesh_axes(module)
    for d in kernels:
        d["producer"]["device_kind"] = kind
    return {
        "format": "tpusim-program-description",
        "version": PROGRAM_VERSION,
        "producer": {"tool": "tpusim.jax", "jax": tj._release().version, "device_kind": kind},
        "mesh": axes,
        "values": reader.values,
        "inputs": inputs,
        "outputs": outputs,
        "ops": reader.ops,
        "kernels": kernels,
    }


class ProgramReport:
    """A whole program simulated on one chip of a slice (crate `tpusim-program`): `latency_ms`,
    `compute_only_ms`, `ici_only_ms`, `ici_hidden_ms`, `xla_flops`, `xla_transcendentals`,
    `xla_bytes_unfused`, `xla_bytes_fused`, `kernel_hbm_bytes`, `fusions` (count), `entries` (one
    dict per fusion, dot, collective or kernel: `name`, `kind`, `ops`, `location`, `seconds`,
    `start`, `end`, `queue`, `flops`, `hbm_bytes`, `detail`), `assumptions`; `json` and `str()`."""

    def __init__(self, json_text, table):
        import json

        self.json = json_text
        self.table = table
        self._d = json.loads(json_text)
        for k, v in self._d.items():
            setattr(self, k, v)

    def by_kind(self, kind):
        """The entries of one kind (`fusion`, `dot`, `collective`, `kernel`)."""
        return [e for e in self.entries if e["kind"] == kind]

    def __str__(self):
        return self.table

    def __repr__(self):
        return f"<tpusim.jax.ProgramReport {self.latency_ms:.4f} ms, {len(self.entries)} groups on {self.slice}>"


def simulate_program(fn, *args, chip="v6e", device_kind=None, mesh=None, slice=None, set=None):
    """Simulates the whole program of `fn(*args)` (its XLA ops, their fusions, collectives and
    Pallas kernels) on one chip of `slice` (`"2x4"`; default the shape of `mesh`, the
    `tpusim.jax.mesh` the function's `shard_map` uses). Returns a `ProgramReport`."""
    import json

    d = describe_program(fn, *args, chip=chip, device_kind=device_kind, mesh=mesh)
    js, table = tj._tpusim.simulate_program_description(
        json.dumps(d), chip=chip, set=tj._overrides(set), slice=None if slice is None else str(slice)
    )
    return ProgramReport(js, table)
