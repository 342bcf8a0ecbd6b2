"""Your own Pallas kernels in tpusim: lowered for TPU on this machine (no TPU needed), read from
their Mosaic IR, simulated on a chip model.

    import tpusim.jax
    reports = tpusim.jax.simulate(fn, *args, chip="v6e")   # one Report per Pallas kernel
    tpusim.jax.describe(fn, *args, path="kernel.json")    # the kernel description file
    tpusim.jax.tune(make_fn, candidates, *args)           # one lowering per candidate, ranked

`fn` is any JAX function that calls `pl.pallas_call` (directly or through a library such as
Splash attention); `args` are arrays or `jax.ShapeDtypeStruct`s. The function is lowered with
`jax.export` for the TPU platform under the simulated chip's device kind (Pallas lowering rules
ask which generation they lower for), each `tpu_custom_call` in the result is decoded (Mosaic's
`mosaic-serde` pass) and its kernel function is read op by op into a kernel description
(`crates/tpusim-pallas/DESCRIPTION.md`), which the Rust crate `tpusim-pallas` lowers to the
engine's program. This module only reads IR and writes descriptions: all modelling is in Rust.

Supported JAX: the releases in `TESTED_JAX` (0.9.0 to 0.10.2; `jax-releases.sh` runs the IR-path
tests under each). The lowering, the reader and the host evaluation adapt to the installed
release, each difference in one place (`JAX_CHANGES` lists them); ops an older release emits for a
computation are rewritten into the newest release's form, so one kernel source gives one
description under every release. A newer release is tried with a `JaxReleaseWarning`; an op or
attribute the reader does not know is an error naming it, the kernel, the source line and the
release. `simulate` times the kernels and lists the XLA ops outside them as not simulated;
`simulate_program(fn, *args, chip=..., slice="2x4", mesh=tpusim.jax.mesh(...))` times the whole
program (fusions, dots, collectives under `shard_map`, kernels; crate `tpusim-program`).
"""

from __future__ import annotations

import base64
import json
import os

from . import _tpusim

InputError = _tpusim.InputError

#: The JAX releases this module is tested with, oldest first: `crates/tpusim-py/jax-releases.sh`
#: runs the IR-path tests under each (CPython 3.11 gets none newer from PyPI), and the package's
#: `jax` extra allows this range. An older release is refused; a newer one (or an untested one inside
#: the range, such as a development build) is tried with a `JaxReleaseWarning`.
TESTED_JAX = ("0.9.0", "0.9.0.1", "0.9.1", "0.9.2", "0.10.0", "0.10.1", "0.10.2")

#: Chip preset -> (JAX device kind, TensorCores per JAX device) to lower under. The kinds are
#: the strings `jax._src.pallas.mosaic.tpu_info.chip_version_from_device_kind` maps to each
#: generation (and TPU devices report); v4 and v5p devices are megacore (two cores per device),
#: each v7x TensorCore is its own device.
DEVICE_KINDS = {
    "v4": ("TPU v4", 2),
    "v5e": ("TPU v5 lite", 1),
    "v5p": ("TPU v5p", 2),
    "v6e": ("TPU v6 lite", 1),
    "v7x": ("TPU7x", 1),
}

#: The description format version this module writes (the Rust reader's `VERSION`).
DESCRIPTION_VERSION = 1


def _side_file_array(values, dtype):
    """A prefetch table's values as the NumPy array its `.npy` side file holds: in the width of
    the table's Mosaic integer type (`i8` .. `i64`, `ui8` ..), signed or unsigned, whichever holds
    every value (Mosaic's types are signless: an `i8` table may hold 0..255), else int64 (tpusim
    reads every integer width)."""
    import re

    import numpy as np

    wide = np.asarray(values, dtype=np.int64)
    m = re.fullmatch(r"(u?)i(8|16|32|64)", dtype or "")
    if m:
        for kind in ("uint", "int") if m[1] else ("int", "uint"):
            info = np.iinfo(kind + m[2])
            if not wide.size or (info.min <= wide.min() and wide.max() <= info.max):
                return wide.astype(kind + m[2])
    return wide


#: Prefetch tables with more elements than this go to `.npy` side files in `describe`.
INLINE_TABLE_LIMIT = 4096


class JaxReleaseWarning(UserWarning):
    """The installed JAX is not one of `TESTED_JAX` (a newer release): it is tried."""


#: Each difference between the tested JAX releases that tpusim.jax adapts to, handled in one place
#: each: (the first release with the newer behaviour, what changed, where it is handled). The
#: reader rewrites an older release's ops into the newest release's form, so the hand models and
#: the Rust side know one form only.
JAX_CHANGES = (
    ("0.9.1", "`jnp.tile` lowers to `tpu.concatenate` of copies (0.9.0, 0.9.0.1: one `tpu.repeat` per dimension, "
     "a repeat of 1 a copy)", "_Reader._repeat"),
    ("0.9.1", "a store to a kernel window no longer casts the value it stores and the value it reads back to "
     "their own type (0.9.0, 0.9.0.1: identity `vector.shape_cast`s; a store to scratch keeps them)", "_Reader._old_shape_cast"),
    ("0.9.1", "a boolean scalar broadcast to a vector lowers to a `vector.broadcast` to `i1` (0.9.0, 0.9.0.1: "
     "an integer `select(flag, 1, 0)` broadcast and compared with a broadcast 1)", "_Reader._old_bool_broadcast"),
    ("0.9.1", "`lax.transpose` lowers to `tpu.transpose` (0.9.0, 0.9.0.1: `vector.transpose`, same permutation)",
     "_Reader._old_transpose"),
    ("0.9.1", "an op's location holds the kernel's frames only (0.9.0, 0.9.0.1: the whole traceback of the trace, "
     "the op's own line first)", "_loc"),
    ("0.9.2", "`jax.experimental.pallas.tpu` imports `absl` without requiring absl-py (0.9.2 only)",
     "the package's `jax` extra (pyproject.toml) and jax-releases.sh install absl-py"),
    ("0.10.0", "the kernel function carries `tpu.core_type` (a TensorCore kernel: `#tpu.core_type<tc>`)",
     "_KERNEL_ATTRS (other core types are refused)"),
    ("0.10.1", "`jax.sharding.AbstractDevice` takes `platform` (before: device kind and cores only)",
     "_JaxRelease.abstract_device"),
    ("0.10.1", "`tpu.matmul` carries `transpose_lhs_hint` (false from Pallas)", "_OP_ATTRS (true is refused)"),
    ("0.10.1", "a `fori_loop` with bounds known at run time lowers to a main loop and a remainder loop "
     "(before: one loop; the remainder runs no iteration at unroll 1)", "nothing to adapt: both loops are read"),
)


def _release_key(version):
    """A release's numbers for ordering: "0.9.0.1" -> (0, 9, 0, 1); a suffix such as ".dev2026" or
    "rc1" ends the numbers (a development build of 0.10.3 orders as 0.10.3)."""
    import re

    nums = []
    for part in str(version).split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        nums.append(int(m.group(0)))
        if m.group(0) != part:
            break
    return tuple(nums)


class _JaxRelease:
    """The installed JAX release and the adaptations that depend on it (`JAX_CHANGES`)."""

    def __init__(self, version):
        self.version = version
        self.key = _release_key(version)

    def before(self, release):
        """Whether the installed release is older than `release` (an entry of `JAX_CHANGES`)."""
        return self.key < _release_key(release)

    def abstract_device(self, kind, cores):
        """The `jax.sharding.AbstractDevice` of a TPU device kind: JAX 0.10.1 added its `platform`
        (Pallas lowering rules ask it); 0.9.0 to 0.10.0 take the device kind and core count only
        and lower for the platform `jax.export` is given. Read from the class's fields, so that a
        release tried as untested gets the form its class has."""
        import dataclasses

        from jax.sharding import AbstractDevice

        fields = {f.name for f in dataclasses.fields(AbstractDevice)} if dataclasses.is_dataclass(AbstractDevice) else set()
        if "platform" not in fields:
            return AbstractDevice(device_kind=kind, num_cores=cores)
        return AbstractDevice(device_kind=kind, num_cores=cores, platform="tpu")


_RANGE = f"{TESTED_JAX[0]} to {TESTED_JAX[-1]}"
_INSTALL = (
    f"pip install 'jax[cpu]=={TESTED_JAX[-1]}' (or any release from {_RANGE}), or from a clone of tpusim "
    "pip install './crates/tpusim-py[jax]'"
)
_warned = set()


def _jax():
    try:
        import jax
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise InputError(f"tpusim.jax needs JAX ({_RANGE}) for CPU: {_INSTALL}") from e
    _release(jax)
    return jax


def _release(jax=None):
    """The installed release (`_JaxRelease`): an older one than `TESTED_JAX` is refused; one not
    listed there (newer) is tried with a `JaxReleaseWarning`, once per process."""
    if jax is None:
        import jax
    version = jax.__version__
    key = _release_key(version)
    if not key or key < _release_key(TESTED_JAX[0]):
        raise InputError(
            f"JAX {version} is installed; tpusim.jax reads the Mosaic IR of JAX {_RANGE} (the tpu dialect changes "
            f"between releases): {_INSTALL}"
        )
    if version not in TESTED_JAX and version not in _warned:
        import warnings

        _warned.add(version)
        newer = key > _release_key(TESTED_JAX[-1])
        warnings.warn(
            f"JAX {version} is {'newer than the releases' if newer else 'not one of the releases'} tpusim.jax is tested with "
            f"({_RANGE}: {', '.join(TESTED_JAX)}); it is tried as {TESTED_JAX[-1]}: an op or attribute its lowering emits "
            "that the reader does not know is an error naming it, and the predictions are not checked against this release",
            JaxReleaseWarning,
            stacklevel=4,
        )
    return _JaxRelease(version)


def _device_kind(chip, device_kind):
    if device_kind is not None:
        known = {k: (name, cores) for name, (k, cores) in DEVICE_KINDS.items()}
        if device_kind not in known:
            kinds = ", ".join(f"{v[0]!r} ({k})" for k, v in DEVICE_KINDS.items())
            raise InputError(f"device_kind = {device_kind!r}: expected one of the JAX device kinds {kinds}")
        return device_kind, known[device_kind][1]
    if chip in DEVICE_KINDS:
        return DEVICE_KINDS[chip]
    kinds = ", ".join(f"{k}: {v[0]!r}" for k, v in DEVICE_KINDS.items())
    raise InputError(
        f"chip = {chip!r}: not a chip preset (the presets are {', '.join(DEVICE_KINDS)}); for a chip model "
        f"file, pass device_kind= with the JAX device kind to lower for (the presets' kinds: {kinds})"
    )


# ----------------------------------------------------------------------------------------------
# Lowering and finding the kernels


def mesh(shape, axis_names, chip="v6e", device_kind=None):
    """The `jax.sharding.AbstractMesh` to pass to `jax.shard_map` in a function that
    `simulate_program` lowers: `shape` (devices per axis, e.g. (2, 4)) and `axis_names`, with the
    chip's TPU device kind (Pallas lowering rules ask for it) and Auto axes. Device i of the mesh
    (row-major over its axes) is chip i of the slice in row-major order of the slice shape."""
    jax = _jax()
    kind, cores = _device_kind(chip, device_kind)
    from jax.sharding import AbstractMesh, AxisType

    shape, axis_names = tuple(int(x) for x in shape), tuple(axis_names)
    if len(shape) != len(axis_names) or not shape or any(x < 1 for x in shape):
        raise InputError(f"mesh: shape {shape} and axis_names {axis_names}: one positive size per named axis")
    return AbstractMesh(
        shape, axis_names, axis_types=(AxisType.Auto,) * len(shape),
        abstract_device=_release(jax).abstract_device(kind, cores),
    )


def _mesh_for(chip, device_kind):
    """The one-device abstract mesh of `chip`'s device kind that functions are lowered under."""
    from jax.sharding import AbstractMesh

    kind, cores = _device_kind(chip, device_kind)
    return AbstractMesh((1,), ("x",), abstract_device=_release().abstract_device(kind, cores))


def lower(fn, *args, chip="v6e", device_kind=None, mesh=None):
    """Lowers `fn(*args)` for TPU under `chip`'s device kind (inside `mesh`, an `AbstractMesh`
    from `tpusim.jax.mesh`, when the function uses `shard_map` over it); returns the
    `jax.export.Exported`.

    Raises `InputError` for an unsupported JAX, a chip without a known device kind, or a
    function that does not lower (the JAX error's message, with our context on top).
    """
    jax = _jax()
    kind, _ = _device_kind(chip, device_kind)
    if mesh is None:
        mesh = _mesh_for(chip, device_kind)
    else:
        mesh_kind = getattr(getattr(mesh, "abstract_device", None), "device_kind", None)
        if mesh_kind is not None and mesh_kind != kind:
            raise InputError(
                f"mesh: built for device kind {mesh_kind!r}, but chip {chip!r} lowers as {kind!r}: build the mesh with "
                f"tpusim.jax.mesh(shape, axis_names, chip={chip!r})"
            )
    # Arguments may be pytrees (dicts of weights): their leaves are arrays or ShapeDtypeStructs.
    def spec(path, a):
        if isinstance(a, jax.ShapeDtypeStruct):
            return a
        if not (hasattr(a, "shape") and hasattr(a, "dtype")):
            where = "args" + jax.tree_util.keystr(path)
            raise InputError(
                f"{where} = {a!r}: expected an array or a jax.ShapeDtypeStruct (shape and dtype), e.g. "
                "jax.ShapeDtypeStruct((1024, 1024), jnp.bfloat16); a Python scalar or list has no TPU layout to lower"
            )
        return jax.ShapeDtypeStruct(a.shape, a.dtype)

    specs = jax.tree_util.tree_map_with_path(spec, list(args))
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            return jax.export.export(fn if hasattr(fn, "trace") else jax.jit(fn), platforms=("tpu",))(*specs)
    except InputError:
        raise
    except Exception as e:
        raise InputError(f"lowering the function for TPU ({kind}) failed: {type(e).__name__}: {e}") from e


def _ir():
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib import tpu as jtpu
    from jaxlib.mlir import ir, passmanager

    return jmlir, jtpu, ir, passmanager


def _context():
    jmlir, jtpu, ir, _ = _ir()
    ctx = jmlir.make_ir_context()
    jtpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True
    return ctx


def _walk(op, f):
    for region in op.regions:
        for block in region.blocks:
            for o in block.operations:
                f(o)
                _walk(o.operation, f)


class _Call:
    """One tpu_custom_call in the exported StableHLO."""

    def __init__(self, op, func_name):
        self.op = op
        self.func_name = func_name


def _find_calls(module):
    """tpu_custom_call ops, their enclosing functions, and the call graph (for tracing operands)."""
    calls, funcs, call_sites, others = [], {}, {}, []
    for f in module.body.operations:
        if f.operation.name != "func.func":
            continue
        name = f.attributes["sym_name"].value
        funcs[name] = f

        def visit(o, name=name):
            n = o.operation.name
            if n == "stablehlo.custom_call":
                tgt = o.attributes["call_target_name"].value
                if tgt == "tpu_custom_call":
                    calls.append(_Call(o, name))
                    return
            if n in ("func.call", "call"):
                call_sites.setdefault(o.attributes["callee"].value, []).append(o)
                return
            if n not in ("func.return", "stablehlo.return"):
                others.append(n)

        _walk(f.operation, visit)
    return calls, funcs, call_sites, others


def _enclosing_loop(op, funcs, call_sites, depth=0):
    """The `stablehlo.while` (a `fori_loop`, `scan` or `while_loop`) that runs `op`, directly or
    through the functions that call its function, or None."""
    o = op.operation
    while True:
        try:
            o = o.parent
        except Exception:
            return None
        if o is None:
            return None
        if o.name == "stablehlo.while":
            return o
        if o.name == "func.func":
            if depth > 32:
                return None
            name = o.attributes["sym_name"].value
            for site in call_sites.get(name, []):
                found = _enclosing_loop(site, funcs, call_sites, depth + 1)
                if found is not None:
                    return found
            return None


def _arg_name(block, idx):
    """The name JAX gave argument `idx` of `main` (its location, the traced parameter's name), or
    `argIDX`."""
    import re

    try:
        m = re.match(r'loc\("([^"]+)"', str(block.arguments[idx].location))
    except Exception:
        m = None
    return m.group(1) if m else f"arg{idx}"


def _value_of(v, funcs, call_sites, args, depth=0):
    """The constant value of a StableHLO SSA value as a NumPy array, or (None, why)."""
    import numpy as np

    _, _, ir, _ = _ir()
    if depth > 50:
        return None, "a value computed through too many calls"
    owner = v.owner
    if isinstance(owner, ir.Block):
        # A function argument: main's are the call's arguments; others come from the call site.
        block = owner
        fop = block.owner
        fname = fop.attributes["sym_name"].value
        idx = ir.BlockArgument(v).arg_number
        if fname == "main":
            a = args[idx] if idx < len(args) else None
            if a is None or not hasattr(a, "__array__") or type(a).__name__ == "ShapeDtypeStruct":
                return None, f"argument `{_arg_name(block, idx)}` of the function, given as a shape only"
            return np.asarray(a), None
        sites = call_sites.get(fname, [])
        if len(sites) != 1:
            return None, f"argument {idx} of {fname}, called from {len(sites)} places"
        return _value_of(sites[0].operands[idx], funcs, call_sites, args, depth + 1)
    op = owner
    name = op.name
    if name == "stablehlo.constant":
        attr = op.attributes["value"]
        try:
            arr = np.array(ir.DenseElementsAttr(attr))
        except Exception:
            t = ir.RankedTensorType(v.type)
            dense = ir.DenseIntElementsAttr(attr)
            arr = np.array(list(dense)).reshape(t.shape) if not dense.is_splat else np.full(t.shape, dense.get_splat_value().value)
        return arr, None
    if name in ("stablehlo.convert", "stablehlo.reshape", "stablehlo.broadcast_in_dim"):
        src, why = _value_of(op.operands[0], funcs, call_sites, args, depth + 1)
        if src is None:
            return None, why
        shape = ir.RankedTensorType(v.type).shape
        if name == "stablehlo.convert":
            return src.astype(np.int64), None
        if name == "stablehlo.reshape":
            return src.reshape(shape), None
        dims = list(ir.DenseI64ArrayAttr(op.attributes["broadcast_dimensions"]))
        expand = [1] * len(shape)
        for i, d in enumerate(dims):
            expand[d] = src.shape[i]
        return np.broadcast_to(src.reshape(expand), shape), None
    if name == "func.call" or name == "call":
        return None, f"the result of a call to {op.attributes['callee'].value}"
    return None, f"the result of `{name}`"


# ----------------------------------------------------------------------------------------------
# Reading a Mosaic kernel function


def _shape_dtype(t):
    _, _, ir, _ = _ir()
    for cls in (ir.VectorType, ir.MemRefType, ir.RankedTensorType):
        try:
            tt = cls(t)
            return list(tt.shape), _dtype(tt.element_type)
        except Exception:
            pass
    return [], _dtype(t)


def _dtype(t):
    s = str(t)
    return {"index": "index"}.get(s, s)


def _memspace(t):
    s = str(t)
    for k in ("smem", "vmem", "any", "hbm", "semaphore_mem"):
        if f"memory_space<{k}>" in s:
            return {"semaphore_mem": "semaphore", "hbm": "any"}.get(k, k)
    if "semaphore" in s:
        return "semaphore"
    return "vmem"


def _source_files(module):
    """The source files (full paths, each once, in order) of a kernel module's op locations."""
    import re

    text = module.operation.get_asm(enable_debug_info=True)
    return list(dict.fromkeys(re.findall(r'"([^"]+\.py)":\d+', text)))


def _loc(op, release=None):
    """An op's source line, `file.py:line`, from its MLIR location: the last frame of the chain
    (JAX 0.9.1 and later keep the kernel's frames only, the kernel function's line last); under
    `release` before 0.9.1 the first (0.9.0 and 0.9.0.1 keep the whole Python traceback of the
    trace, the op's own line first and the caller of `jax.export` last)."""
    s = str(op.location)
    # loc("name"("file":line:col)) -> file:line
    import re

    m = re.findall(r'"([^"]+\.py)":(\d+)', s)
    if m:
        f, line = m[0] if release is not None and release.before("0.9.1") else m[-1]
        return f"{os.path.basename(f)}:{line}"
    return s[4:-1] if s.startswith("loc(") else s


_CMP = {
    "eq": "eq", "ne": "ne", "slt": "lt", "sle": "le", "sgt": "gt", "sge": "ge",
    "ult": "lt", "ule": "le", "ugt": "gt", "uge": "ge",
}
_SCALAR_BIN = {
    "arith.addi": "add", "arith.subi": "sub", "arith.muli": "mul", "arith.divsi": "div",
    "arith.divui": "div", "arith.floordivsi": "floordiv", "arith.ceildivsi": "ceildiv",
    "arith.remsi": "rem", "arith.remui": "rem", "arith.minsi": "min", "arith.maxsi": "max",
    "arith.minui": "min", "arith.maxui": "max", "arith.andi": "and", "arith.ori": "or",
    "arith.xori": "xor", "arith.shli": "shl", "arith.shrsi": "shr", "arith.shrui": "shr",
}
_SCALAR_CAST = {"arith.index_cast", "arith.extsi", "arith.extui", "arith.trunci", "arith.index_castui", "arith.bitcast"}


class _Key(str):
    """A value's key in the reader's maps: its printed SSA name (what messages show) and its
    identity. MLIR numbers values again in sibling regions (the branches of an `scf.if`, the
    bodies of consecutive loops), so two values may print alike; a name alone would hand one
    value's window, size or index to the other."""

    def __new__(cls, name, ident):
        k = super().__new__(cls, name)
        k._ident = ident
        return k

    def __hash__(self):
        return hash((str(self), self._ident))

    def __eq__(self, other):
        return isinstance(other, _Key) and str(self) == str(other) and self._ident == other._ident

    def __ne__(self, other):
        return not self.__eq__(other)


def _is_kernel_func(f):
    """Whether a Mosaic module's func is the kernel (not an index map): it carries the grid, the
    windows or the scalar-prefetch count (a call with no grid has only the last, or none)."""
    a = f.attributes
    return any(k in a for k in ("iteration_bounds", "window_params", "scalar_prefetch", "dimension_semantics"))


class _Reader:
    """Reads one kernel module into a description dict."""

    def __init__(self, module, kernel_name, prefetch_values, release, smem_input_values=None):
        self.module = module
        self.kernel_name = kernel_name
        self.prefetch_values = prefetch_values
        self.release = release
        # Input window -> the values of an SMEM input (a table the call passes in SMEM without
        # scalar prefetch: a grid-less `pallas_call`'s or a `pl.kernel`'s `pltpu.SMEM` operand).
        self.smem_input_values = smem_input_values or {}
        self.tables = set()  # refs whose values the description holds (prefetch, SMEM inputs)
        self.funcs = {}
        for f in module.body.operations:
            if f.operation.name == "func.func":
                self.funcs[f.attributes["sym_name"].value] = f
        self.main = None
        for f in self.funcs.values():
            if _is_kernel_func(f):
                self.main = f
                break
        if self.main is None:
            self.main = next(iter(self.funcs.values()))
        self.next_id = 0
        self.ids = {}  # SSA value (as str of its get_name) -> op id
        self.scalars = {}  # SSA value -> expression
        self.refs = {}  # block argument value -> ref index
        self.views = {}  # sliced memref value -> (ref index, offsets, window shape, kept dims)
        self.sem_allocs = {}  # semaphore value allocated in the body -> its id (views: -1 - id)
        self.buf_allocs = {}  # buffer a scoped region allocates (memref.alloca) -> its id (views: -1 - id)
        self.allocations = []  # what the body allocates: id, shape, dtype, memory space, loc
        self.dyn_dims = {}  # memref value with dimensions sized at run time -> its dimensions (ints, expressions)
        self.grid_sizes = []  # the grid's sizes, dynamic ones as computed (for `tpu.iteration_bound`)
        self._asm = None
        self.mutable = set()
        self.ref_kinds, self.ref_names, self.ref_spaces = [], [], []

    def _key(self, v):
        # One AsmState for the module: without it every get_name numbers the whole function
        # again (seconds for a paged-attention kernel).
        if self._asm is None:
            _, _, ir, _ = _ir()
            self._asm = ir.AsmState(self.module.operation)
        return _Key(v.get_name(self._asm), hash(v))

    def _loc(self, op):
        return _loc(op, self.release)

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    # scalar expressions -----------------------------------------------------------------
    def _int_attr(self, a):
        _, _, ir, _ = _ir()
        try:
            return ir.IntegerAttr(a).value
        except Exception:
            pass
        try:
            return 1 if ir.BoolAttr(a).value else 0
        except Exception:
            pass
        try:
            return ir.FloatAttr(a).value
        except Exception:
            return None

    def scalar(self, v, index_fn=None):
        """The expression of a scalar SSA value in the current function."""
        k = self._key(v)
        if k in self.scalars:
            return self.scalars[k]
        return ["unknown", f"the scalar {k}"]

    def define_scalar(self, op):
        """Expressions for scalar results of `op` (grid-index arithmetic, SMEM loads)."""
        name = op.name
        res = op.results
        if len(res) != 1:
            return
        r = res[0]
        k = self._key(r)
        if name == "arith.constant":
            val = self._int_attr(op.attributes["value"])
            if isinstance(val, (int, bool)):
                self.scalars[k] = int(val)
            else:
                self.scalars[k] = ["unknown", f"the float constant {val}"]
        elif name in _SCALAR_BIN:
            self.scalars[k] = [_SCALAR_BIN[name], self.scalar(op.operands[0]), self.scalar(op.operands[1])]
        elif name in _SCALAR_CAST or name == "tpu.assume_multiple":
            # `pl.multiple_of` (`tpu.assume_multiple`) only states a fact about its value.
            self.scalars[k] = self.scalar(op.operands[0])
        elif name == "arith.cmpi":
            pred = str(op.attributes["predicate"])
            # IntegerAttr printed as e.g. "0 : i64": map the enum index.
            names = ["eq", "ne", "slt", "sle", "sgt", "sge", "ult", "ule", "ugt", "uge"]
            try:
                p = names[self._int_attr(op.attributes["predicate"])]
            except Exception:
                p = pred
            self.scalars[k] = [_CMP.get(p, "eq"), self.scalar(op.operands[0]), self.scalar(op.operands[1])]
        elif name == "arith.select":
            self.scalars[k] = ["select", self.scalar(op.operands[0]), self.scalar(op.operands[1]), self.scalar(op.operands[2])]
        elif name in ("memref.load", "tpu.load") and len(op.operands) >= 1:
            base = self._key(op.operands[0])
            ri = self.refs.get(base)
            if ri is not None and (self.ref_kinds[ri] == "prefetch" or ri in self.tables):
                self.scalars[k] = ["load", ri, [self.scalar(x) for x in op.operands[1:]]]
            elif ri is not None:
                self.scalars[k] = ["unknown", f"a value the kernel loads from `{self.ref_names[ri]}` at run time"]
            else:
                self.scalars[k] = ["unknown", f"a value loaded from {base}"]
        elif name in ("tpu.iteration_bound",):
            # `pl.num_programs(d)`: the grid's size along d (a dynamic one as the call computes it).
            dim = None
            for an in op.attributes:  # its one integer attribute (printed `tpu.iteration_bound 0`)
                v = self._int_attr(op.attributes[an])
                if isinstance(v, int) and not isinstance(v, bool):
                    dim = v
                    break
            g = self.grid_sizes[dim] if dim is not None and dim < len(self.grid_sizes) else -1
            self.scalars[k] = g if g >= 0 else ["unknown", f"the size of grid dimension {dim} (`pl.num_programs`), set at run time"]
        else:
            self.scalars[k] = ["unknown", f"the result of `{name}`"]

    # the index-map functions ------------------------------------------------------------
    def index_map(self, sym, nidx):
        f = self.funcs[sym]
        block = f.regions[0].blocks[0]
        saved = self.scalars
        self.scalars = {}
        saved_refs = self.refs
        self.refs = {}
        for i, a in enumerate(block.arguments):
            if i < nidx:
                self.scalars[self._key(a)] = ["grid", i]
            else:
                self.refs[self._key(a)] = i - nidx  # prefetch refs come first
        out = None
        for o in block.operations:
            if o.operation.name == "func.return":
                out = [self.scalar(x) for x in o.operands]
            elif len(o.results) == 1 and not _is_vector(o.results[0].type):
                self.define_scalar(o.operation)
        self.scalars = saved
        self.refs = saved_refs
        return out or []

    def transform(self, attr, nidx, ref_name):
        """A window's index map from its `transform_indices`: the symbol of an index-map function
        of the module, or an affine map over the grid indices (`pl.kernel` on a TensorCore mesh
        writes `affine_map<(d0) -> (0)>` for a whole-array window). Anything else is an error
        naming the kernel and the ref."""
        _, _, ir, _ = _ir()
        try:
            amap = ir.AffineMapAttr(attr).value
        except Exception:
            amap = None
        if amap is None:
            try:
                sym = ir.FlatSymbolRefAttr(attr).value
            except Exception:
                sym = str(attr).lstrip("@")
            if sym not in self.funcs:
                raise InputError(
                    f"kernel `{self.kernel_name}`: the index map of `{ref_name}` is `{attr}`: neither a function of the kernel's "
                    "module nor an affine map over the grid indices (the two forms of a window's transform_indices tpusim.jax reads)"
                )
            return self.index_map(sym, nidx)
        if amap.n_symbols or amap.n_dims != nidx:
            raise InputError(
                f"kernel `{self.kernel_name}`: the index map of `{ref_name}` is `{attr}`: expected an affine map of the "
                f"{nidx} grid indices and no symbols"
            )
        return [_affine_expr(e, self.kernel_name, ref_name) for e in amap.results]

    # the body ---------------------------------------------------------------------------
    def body_ops(self, block, depth):
        out = []
        for o in block.operations:
            op = o.operation
            name = op.name
            if name in ("func.return",):
                continue
            self._check_known(op)
            if name == "tpu.log" and not getattr(self, "_warned_log", False):
                # `pl.debug_print`: simulated as free, and said so once per kernel.
                import warnings

                self._warned_log = True
                warnings.warn(
                    f"kernel `{self.kernel_name}`, {self._loc(op)}: `pl.debug_print` (`tpu.log`) is taken as free; "
                    "on a TPU a print costs scalar-core time each step it runs (and prints only with the log "
                    "recorder on), so time the kernel without it",
                    stacklevel=2,
                )
            rewrite = _REWRITES.get(name)
            if rewrite is not None and (rewrite[0] is None or self.release.before(rewrite[0])) and getattr(self, rewrite[1])(op, out):
                continue
            if name == "scf.yield":
                ops = []
                for x in op.operands:
                    ops.append(self.operand(x))
                out.append({"op": "scf.yield", "operands": ops})
                continue
            if name == "scf.if":
                cond = self.scalar(op.operands[0])
                then = self.body_ops(op.regions[0].blocks[0], depth)
                els = self.body_ops(op.regions[1].blocks[0], depth) if len(op.regions) > 1 and len(op.regions[1].blocks) else []
                ids = []
                for i, r in enumerate(op.results):
                    if _is_vector(r.type):
                        ids.append(self._bind(r))
                    else:
                        # A scalar result: the yielded value of the branch taken.
                        self.scalars[self._key(r)] = ["select", cond, _yielded(then, i), _yielded(els, i)]
                        ids.append(None)
                for region in (then, els):
                    for y in region:
                        if y.get("op") == "scf.yield":
                            y["attrs"] = {"results": ids}
                out.append({"op": "scf.if", "cond": cond, "then": then, "else": els, "loc": self._loc(op)})
                continue
            if name == "scf.for":
                lo, hi, st = (self.scalar(x) for x in op.operands[:3])
                blk = op.regions[0].blocks[0]
                self.scalars[self._key(blk.arguments[0])] = ["iv", depth]
                # Loop-carried values: vectors are bound to the init operands' values; scalars
                # are variables set from `init` and each iteration's `yield` (DESCRIPTION.md).
                carried, init = [], []
                for a, x in zip(list(blk.arguments)[1:], list(op.operands)[3:]):
                    if not _is_vector(a.type):
                        i = self._new_id()
                        self.scalars[self._key(a)] = ["var", i]
                        carried.append(i)
                        init.append(self.scalar(x))
                    elif self._key(x) in self.ids:
                        self.ids[self._key(a)] = self.ids[self._key(x)]
                body = self.body_ops(blk, depth + 1)
                ids, results, yields = [], [], []
                for k, r in enumerate(op.results):
                    if _is_vector(r.type):
                        ids.append(self._bind(r))
                    else:
                        i = self._new_id()
                        self.scalars[self._key(r)] = ["var", i]
                        results.append(i)
                        yields.append(_yielded(body, k))
                        ids.append(None)
                for y in body:
                    if y.get("op") == "scf.yield":
                        y["attrs"] = {"results": ids}
                d = {"op": "scf.for", "lower": lo, "upper": hi, "step": st, "then": body, "loc": self._loc(op)}
                if carried:
                    d["attrs"] = {"carried": carried, "init": init, "yield": yields, "results": results}
                out.append(d)
                continue
            if name == "scf.while":
                before, after = op.regions[0].blocks[0], op.regions[1].blocks[0]
                if any(_is_vector(a.type) for a in list(before.arguments) + list(after.arguments)):
                    raise InputError(
                        f"kernel `{self.kernel_name}`: scf.while at {self._loc(op)}: a lax.while_loop that carries a vector "
                        "is not read (its trip count and carried values are found from scalars only): keep the vector "
                        "in a ref the loop body reads and writes (a pltpu.VMEM scratch, or the output block) and carry "
                        "only scalars, or use lax.fori_loop, whose vector carries are read"
                    )
                carried = []
                for a in before.arguments:
                    i = self._new_id()
                    self.scalars[self._key(a)] = ["var", i]
                    carried.append(i)
                init = [self.scalar(x) for x in op.operands]
                before_ops = self.body_ops(before, depth)
                condop = [o for o in before.operations if o.operation.name == "scf.condition"][-1].operation
                cond = self.scalar(condop.operands[0])
                forward = [self.scalar(x) for x in list(condop.operands)[1:]]
                args = []
                for a in after.arguments:
                    i = self._new_id()
                    self.scalars[self._key(a)] = ["var", i]
                    args.append(i)
                body = self.body_ops(after, depth)
                yields = [_yielded(body, k) for k in range(len(carried))]
                results = []
                for r in op.results:
                    i = self._new_id()
                    self.scalars[self._key(r)] = ["var", i]
                    results.append(i)
                out.append({
                    "op": "scf.while", "cond": cond, "then": body, "else": before_ops, "loc": self._loc(op),
                    "attrs": {"carried": carried, "init": init, "forward": forward, "args": args, "yield": yields, "results": results},
                })
                continue
            if name == "scf.condition":
                continue
            if name == "tpu.region":
                # `pl.run_scoped` (and `pltpu.emit_pipeline`, which allocates its buffers with
                # it): the region's ops run in its place; its results are what it yields.
                inner = op.regions[0].blocks[0]
                body = self.body_ops(inner, depth)
                yielded = [o.operation for o in inner.operations if o.operation.name == "tpu.yield"]
                for r, y in zip(op.results, list(yielded[-1].operands) if yielded else []):
                    if _is_vector(r.type):
                        if self._key(y) in self.ids:
                            self.ids[self._key(r)] = self.ids[self._key(y)]
                    else:
                        self.scalars[self._key(r)] = self.scalar(y)
                out.extend(body)
                continue
            if name == "tpu.yield":
                continue
            if name in ("tpu.memref_slice", "tpu.memref_squeeze"):
                self._view(op)
                continue
            if name == "tpu.sem_alloc":
                # A semaphore `pl.run_scoped` allocates (`pltpu.emit_pipeline`'s): named by an id
                # of its own, so that copies and waits on it can be paired.
                self.sem_allocs[self._key(op.results[0])] = self._new_id()
                self._allocation(op, self.sem_allocs[self._key(op.results[0])])
                continue
            if name == "memref.alloca":
                # A buffer `pl.run_scoped` allocates (`pltpu.emit_pipeline`'s: one slot per
                # buffer of a `pl.Buffered(n)` window along its first dimension).
                self.buf_allocs[self._key(op.results[0])] = self._new_id()
                self._allocation(op, self.buf_allocs[self._key(op.results[0])])
                continue
            if name == "memref.load" and self.refs.get(self._key(op.operands[0])) in self.mutable:
                ri = self.refs[self._key(op.operands[0])]
                i = self._new_id()
                self.scalars[self._key(op.results[0])] = ["var", i]
                out.append({"op": "memref.load", "id": i, "operands": [{"ref": ri}], "attrs": {"index": [self.scalar(x) for x in op.operands[1:]]}, "loc": self._loc(op)})
                continue
            if name == "memref.store" and self.refs.get(self._key(op.operands[1])) is not None:
                ri = self.refs[self._key(op.operands[1])]
                if self.ref_kinds[ri] == "prefetch" or self.ref_spaces[ri] == "smem":
                    out.append({"op": "memref.store", "id": self._new_id(), "operands": [{"ref": ri}], "attrs": {"value": self.scalar(op.operands[0]), "index": [self.scalar(x) for x in op.operands[2:]]}, "loc": self._loc(op)})
                continue
            vector_result = any(_is_vector(r.type) for r in op.results)
            if not vector_result and name not in _VECTOR_SIDE_EFFECTS:
                # Scalar work: expressions (the scalar unit's time is in the step overhead).
                if len(op.results) == 1:
                    self.define_scalar(op)
                elif name not in _SCALAR_FREE and len(op.results) == 0:
                    out.append(self.vector_op(op))
                continue
            out.append(self.vector_op(op))
        return out

    # what the reader knows, and older releases' ops --------------------------------------
    def _unknown(self, op, what):
        """The error for an op or attribute the reader does not know."""
        r = self.release
        tested = r.version in TESTED_JAX
        return InputError(
            f"kernel `{self.kernel_name}`, {self._loc(op)}: {what} (lowered by JAX {r.version}, "
            f"{'a tested release' if tested else f'not a tested release: tpusim.jax is tested with JAX {_RANGE}'}): "
            "tpusim.jax does not know what it costs, and takes nothing unknown as free or as zero; "
            + ("a kernel with it cannot be simulated yet" if tested else f"with JAX {TESTED_JAX[-1]} ({_INSTALL}) the kernel may lower to ops it knows")
        )

    def _check_known(self, op):
        """Refuses an op the reader does not know, or an attribute of an op it does not know or
        with a value it does not model (`_OP_ATTRS`). Scalar ops it does not know become
        `["unknown", ...]` expressions instead, refused only where they steer the path."""
        name = op.name
        known = _OP_ATTRS.get(name)
        if known is None:
            if any(_is_vector(r.type) for r in op.results) or (not op.results and name not in _SCALAR_FREE):
                raise self._unknown(op, f"`{name}` is an op the reader does not know")
            return
        for an in op.attributes:
            an = an if isinstance(an, str) else an.name
            if an not in known:
                raise self._unknown(op, f"`{name}` has the attribute `{an}` = {op.attributes[an]}, which the reader does not know")
            want = known[an]
            if want is not None and str(op.attributes[an]) not in want:
                raise self._unknown(
                    op, f"`{name}` has `{an}` = {op.attributes[an]}, and the reader models it at {' or '.join(want)} only"
                )

    def _alias(self, result, source):
        """`result` is the value `source` is (an op that does not change it)."""
        k = self._key(source)
        if k in self.ids:
            self.ids[self._key(result)] = self.ids[k]
            return True
        return False

    def _repeat(self, op, out):
        """JAX before 0.9.1 (0.9.0, 0.9.0.1): `jnp.tile` lowers to one `tpu.repeat` per
        dimension (so does `pltpu.repeat`, which 0.10 removed), a repeat of 1 leaving its operand
        as it is; 0.9.1 and later lower it to a `tpu.concatenate` of the copies. Rewritten so, in
        every release (the op means the same in each): a repeat of 1 is its operand, a repeat of
        n a concatenation of n copies along its dimension."""
        times = self._int_attr(op.attributes["times"])
        src = op.operands[0]
        if times == 1:
            return self._alias(op.results[0], src)
        out.append(self.vector_op(op, name="tpu.concatenate", operands=[src] * times))
        return True

    def _old_shape_cast(self, op, out):
        """JAX before 0.9.1 (0.9.0, 0.9.0.1): a store to a kernel window (an input or output
        block) casts the value it stores, and the old value it reads back, to their own type (a
        `vector.shape_cast` from a type to itself: the value's sharding differs from the
        window's under the abstract mesh the kernel is lowered in); 0.9.1 and later cast so only
        for a scratch ref (`pltpu.VMEM`). Such a cast into a window, or of a window's read-back
        that nothing uses, is its operand; every other cast is read as it is."""
        src, res = op.operands[0], op.results[0]
        if str(src.type) != str(res.type):
            return False
        uses = [(u.owner.operation if hasattr(u.owner, "operation") else u.owner, u.operand_number) for u in res.uses]
        if not uses:
            load = src.owner
            if isinstance(load, _ir()[2].Block) or load.name not in ("vector.load", "tpu.strided_load") or not self._is_window(load.operands[0]):
                return False
            return True
        if not all(o.name in _STORES and n == 0 and self._is_window(o.operands[1]) for o, n in uses):
            return False
        return self._alias(res, src)

    def _old_bool_broadcast(self, op, out):
        """JAX before 0.9.1 (0.9.0, 0.9.0.1): a boolean scalar broadcast to a vector (`jnp.
        broadcast_to(flag, shape)`, Splash's partial-block flag) lowers as an integer: `select(flag,
        1, 0)` broadcast, a broadcast 1, and `cmpi eq` of the two; 0.9.1 and later broadcast the
        boolean (`vector.broadcast` to `i1`). The two broadcasts are dropped and the comparison
        read as that one broadcast of the flag."""
        if op.name == "arith.cmpi":
            flag = self._bool_broadcast_flag(op)
            if flag is None:
                return False
            out.append(self.vector_op(op, name="vector.broadcast", operands=[flag]))
            return True
        # A broadcast of the pattern: read at its comparison.
        uses = [u.owner.operation if hasattr(u.owner, "operation") else u.owner for u in op.results[0].uses]
        return len(uses) == 1 and uses[0].name == "arith.cmpi" and self._bool_broadcast_flag(uses[0]) is not None

    def _bool_broadcast_flag(self, cmp):
        """The boolean scalar an older release's `cmpi eq (broadcast (select flag 1 0)),
        (broadcast 1)` broadcasts, or None when `cmp` is not that."""
        _, _, ir, _ = _ir()
        if self._int_attr(cmp.attributes["predicate"]) != 0 or len(cmp.operands) != 2 or not _is_vector(cmp.results[0].type):
            return None

        def owner(v):
            o = v.owner
            return None if isinstance(o, ir.Block) else (o.operation if hasattr(o, "operation") else o)

        def const(v):
            o = owner(v)
            return self._int_attr(o.attributes["value"]) if o is not None and o.name == "arith.constant" else None

        a, b = (owner(x) for x in cmp.operands)
        if a is None or b is None or a.name != "vector.broadcast" or b.name != "vector.broadcast":
            return None
        if any(sum(1 for _ in x.results[0].uses) != 1 for x in (a, b)) or const(b.operands[0]) != 1:
            return None
        sel = owner(a.operands[0])
        if sel is None or sel.name != "arith.select" or _is_vector(sel.results[0].type):
            return None
        if const(sel.operands[1]) != 1 or const(sel.operands[2]) != 0 or str(sel.operands[0].type) != "i1":
            return None
        return sel.operands[0]

    def _is_window(self, v):
        """Whether the memref `v` is a kernel window (an input or output block) or a view of one."""
        k = self._key(v)
        ri = self.refs.get(k)
        if ri is None and k in self.views:
            ri = self.views[k][0]
        return ri is not None and 0 <= ri < len(self.ref_kinds) and self.ref_kinds[ri] in ("input", "output")

    def _old_transpose(self, op, out):
        """JAX before 0.9.1: `lax.transpose` lowers to `vector.transpose`; 0.9.1 and later to
        `tpu.transpose` with the same permutation."""
        out.append(self.vector_op(op, name="tpu.transpose"))
        return True

    def _dims(self, v):
        """A memref value's dimensions: integers, and for the ones sized at run time (MLIR's `?`)
        the expressions of their sizes (`["unknown", why]` where the size is not followed)."""
        k = self._key(v)
        if k in self.dyn_dims:
            return list(self.dyn_dims[k])
        shape, _ = _shape_dtype(v.type)
        return [s if s >= 0 else ["unknown", f"the run-time size of dimension {j} of {k}"] for j, s in enumerate(shape)]

    def _view(self, op):
        """Tracks which window of which kernel ref a sliced / squeezed memref is (DMA sources),
        and the sizes of dimensions a slice sizes at run time (`pl.ds(start, size)` with a traced
        size: `tpu.memref_slice`'s dynamic sizes, one per `?` of its result)."""
        src = self._key(op.operands[0])
        src_rank = len(_shape_dtype(op.operands[0].type)[0])
        out_shape, _ = _shape_dtype(op.results[0].type)
        if op.name == "tpu.memref_slice":
            dyn = [self.scalar(x) for x in list(op.operands)[1 + src_rank:]]
            sizes = []
            for s in out_shape:
                if s >= 0:
                    sizes.append(s)
                else:
                    sizes.append(dyn.pop(0) if dyn else ["unknown", f"a run-time slice size of {self._key(op.results[0])}"])
        else:
            # Squeeze: the source's dimensions without the unit ones dropped (only static ones are).
            cur = self._dims(op.operands[0])
            drop = len(cur) - len(out_shape)
            sizes = []
            for c in cur:
                if drop > 0 and c == 1:
                    drop -= 1
                    continue
                sizes.append(c)
            if len(sizes) != len(out_shape):
                sizes = self._dims(op.results[0])
        if any(not isinstance(s, int) for s in sizes):
            self.dyn_dims[self._key(op.results[0])] = sizes
        if src in self.views:
            ri, offs, win, dims = self.views[src]
        elif src in self.refs or src in self.sem_allocs or src in self.buf_allocs:
            ri = self.refs[src] if src in self.refs else -1 - self.sem_allocs.get(src, self.buf_allocs.get(src))
            shape, _ = _shape_dtype(op.operands[0].type)
            offs, win, dims = [0] * len(shape), list(shape), list(range(len(shape)))
        else:
            return
        offs, win, dims = list(offs), list(win), list(dims)
        if op.name == "tpu.memref_slice":
            idx = [self.scalar(x) for x in list(op.operands)[1 : 1 + src_rank]]
            if len(idx) != len(dims) or len(out_shape) != len(dims):
                return
            for j, b in enumerate(dims):
                offs[b] = idx[j] if offs[b] == 0 else ["add", offs[b], idx[j]]
                win[b] = sizes[j]
        else:
            # Squeeze: drop the leftmost unit dimensions until the ranks agree.
            cur = [win[b] for b in dims]
            drop = len(cur) - len(out_shape)
            keep = []
            for k, b in enumerate(dims):
                if drop > 0 and cur[k] == 1:
                    drop -= 1
                    continue
                keep.append(b)
            if len(keep) != len(out_shape):
                return
            dims = keep
        self.views[self._key(op.results[0])] = (ri, offs, win, dims)

    def _semaphore(self, v, attrs):
        """Names the DMA semaphore `v` is (a semaphore ref, or an element of a semaphore array)
        in `attrs`: `sem_ref` (or `sem_alloc`, the id of a semaphore the body allocates) and
        `sem_offsets` (index expressions), when it is traced to one."""
        k = self._key(v)
        if k in self.views:
            ri, offs, _, _ = self.views[k]
        elif k in self.refs:
            ri, offs = self.refs[k], []
        elif k in self.sem_allocs:
            ri, offs = -1 - self.sem_allocs[k], []
        else:
            return
        if ri < 0:
            attrs["sem_alloc"] = -1 - ri
        else:
            attrs["sem_ref"] = ri
        attrs["sem_offsets"] = list(offs)

    def _allocation(self, op, i):
        shape, dtype = _shape_dtype(op.results[0].type)
        self.allocations.append({"id": i, "shape": shape, "dtype": dtype, "memory_space": _memspace(op.results[0].type), "loc": _loc(op)})

    def _window(self, v, attrs, prefix):
        """Names what a copy's source (`prefix` "src") or target ("dst") is a window of, when it is
        traced to one: a kernel ref (`{prefix}_ref`) or a buffer the body allocates
        (`{prefix}_alloc`), with the window's offsets (and a source's shape)."""
        view = self.views.get(self._key(v))
        if view is None:
            return
        ri, offs, win, _ = view
        if ri >= 0:
            attrs[f"{prefix}_ref"] = ri
        elif (-1 - ri) in self.buf_allocs.values():
            attrs[f"{prefix}_alloc"] = -1 - ri
        else:
            return
        attrs[f"{prefix}_offsets"] = offs
        if prefix == "src":
            attrs["src_shape"] = win

    def _bind(self, r):
        i = self._new_id()
        self.ids[self._key(r)] = i
        return i

    def operand(self, x):
        k = self._key(x)
        if k in self.ids:
            return {"op": self.ids[k]}
        if k in self.refs:
            return {"ref": self.refs[k]}
        if not _is_vector(x.type):
            return {"scalar": self.scalar(x)}
        return "other"

    def vector_op(self, op, name=None, operands=None):
        """The description of a vector or side-effect op; `name` and `operands` (MLIR values)
        replace the op's own for an older release's op rewritten into the newest form."""
        name = name or op.name
        operands = list(op.operands) if operands is None else operands
        d = {"op": name, "operands": [self.operand(x) for x in operands], "loc": self._loc(op)}
        if len(op.results) >= 1:
            shape, dtype = _shape_dtype(op.results[0].type)
            d["shape"], d["dtype"] = shape, dtype
            d["id"] = self._bind(op.results[0])
            for r in list(op.results)[1:]:
                self.ids[self._key(r)] = d["id"]
        else:
            d["id"] = self._new_id()
        attrs = {}
        a = op.attributes
        if name == "tpu.iota":
            attrs["dims"] = list(_ints(a["dimensions"])) if "dimensions" in a else []
        elif name == "vector.multi_reduction":
            attrs["dims"] = list(_ints(a["reduction_dims"]))
            attrs["kind"] = str(a["kind"])
        elif name == "tpu.concatenate":
            attrs["dimension"] = self._int_attr(a["dimension"])
        elif name in ("vector.extract_strided_slice", "vector.insert_strided_slice") and "offsets" in a:
            # Where the slice starts: a start off the register tile shifts the data across
            # lanes or sublanes.
            attrs["offsets"] = list(_ints(a["offsets"]))
        elif name in ("tpu.transpose", "vector.transpose") and "permutation" in a:
            attrs["permutation"] = list(_ints(a["permutation"]))
        elif name in ("tpu.matmul", "vector.contract"):
            attrs.update(_matmul_attrs(op))
        elif name == "tpu.enqueue_dma":
            _, src_dtype = _shape_dtype(op.operands[0].type)
            # Bytes: the source's elements x element bytes; a dimension sized at run time makes
            # it an expression over the values that size it (never a size taken as 0).
            n = _bytes(src_dtype)
            for s in self._dims(op.operands[0]):
                n = n * s if isinstance(s, int) and isinstance(n, int) else ["mul", n, s]
            attrs["bytes"] = n
            # Where it copies from and to (`any` is HBM): a copy from HBM to HBM reads and
            # writes its bytes there.
            for key, x in (("src_space", op.operands[0]), ("dst_space", op.operands[1])):
                attrs[key] = _memspace(x.type)
            self._window(op.operands[0], attrs, "src")
            self._window(op.operands[1], attrs, "dst")
            # The semaphore the copy signals on arrival (`target_semaphore`: the last semaphore
            # operand; a remote copy's `source_semaphore` comes before it).
            sems = [x for x in op.operands if "semaphore" in str(x.type)]
            if sems:
                self._semaphore(sems[-1], attrs)
        elif name in ("tpu.wait_dma2", "tpu.wait_dma"):
            # wait_dma2: semaphore, src, dst (it waits for the dst's bytes); wait_dma: semaphore, ref.
            ops = list(op.operands)
            if ops and "semaphore" in str(ops[0].type):
                self._semaphore(ops[0], attrs)
            dst = ops[2] if name == "tpu.wait_dma2" and len(ops) >= 3 else (ops[1] if len(ops) >= 2 else None)
            if dst is not None and "semaphore" not in str(dst.type):
                _, dst_dtype = _shape_dtype(dst.type)
                n = _bytes(dst_dtype)
                for s_ in self._dims(dst):
                    n = n * s_ if isinstance(s_, int) and isinstance(n, int) else ["mul", n, s_]
                attrs["bytes"] = n
        if attrs:
            d["attrs"] = attrs
        if len(op.results) == 0:
            d.pop("shape", None)
        return d

    def read(self, grid_refs_from_call):
        f = self.main
        a = f.attributes
        for an in a:
            an = an if isinstance(an, str) else an.name
            want = _KERNEL_ATTRS.get(an, ())
            if want == ():
                raise self._unknown(f.operation, f"the kernel function has the attribute `{an}` = {a[an]}, which the reader does not know")
            if want is not None and str(a[an]) not in want:
                raise self._unknown(f.operation, f"the kernel function has `{an}` = {a[an]}, and the reader models {' or '.join(want)} only")
        grid = list(_ints(a["iteration_bounds"])) if "iteration_bounds" in a else []
        sem = [str(x).split("<")[-1].rstrip(">") for x in a["dimension_semantics"]] if "dimension_semantics" in a else []
        nprefetch = self._int_attr(a["scalar_prefetch"]) if "scalar_prefetch" in a else 0
        nscratch = self._int_attr(a["scratch_operands"]) if "scratch_operands" in a else 0
        windows = list(a["window_params"]) if "window_params" in a else []
        block = f.regions[0].blocks[0]
        args = list(block.arguments)
        nidx = len(grid)
        for i in range(nidx):
            self.scalars[self._key(args[i])] = ["grid", i]
        n_in, n_out = grid_refs_from_call
        self.ref_kinds = ["prefetch"] * nprefetch
        self.ref_names = [f"prefetch {j}" for j in range(nprefetch)]
        refs = []
        kinds, names = [], []
        rest = args[nidx:]
        for j, arg in enumerate(rest):
            shape, dtype = _shape_dtype(arg.type)
            ms = _memspace(arg.type)
            if j < nprefetch:
                kind, nm = "prefetch", f"prefetch {j}"
            elif j < len(rest) - nscratch:
                w = j - nprefetch
                kind = "input" if w < n_in else "output"
                nm = f"{kind} {w if w < n_in else w - n_in}"
            else:
                kind, nm = "scratch", f"scratch {j - (len(rest) - nscratch)}"
            if ms == "semaphore":
                kind = "scratch"
            ref = {"name": nm, "kind": kind, "shape": shape, "dtype": dtype, "memory_space": ms}
            if kind in ("input", "output"):
                w = j - nprefetch
                wp = windows[w] if w < len(windows) else None
                if wp is not None:
                    wp = _dict_attr(wp)
                    for key in wp:
                        if key not in ("transform_indices", "window_bounds", "pipeline_mode"):
                            raise self._unknown(f.operation, f"the window of {nm} has `{key}` = {wp[key]}, which the reader does not know")
                    if "window_bounds" in wp:
                        ref["shape"] = list(_ints(wp["window_bounds"]))
                    if "transform_indices" in wp:
                        ref["index_map"] = self.transform(wp["transform_indices"], nidx, nm)
                    else:
                        ref["memory_space"] = "any" if ms != "smem" else ms
                    if "pipeline_mode" in wp:
                        pm = str(wp["pipeline_mode"])
                        ref["pipeline_mode"] = "synchronous" if "synchronous" in pm else "double"
                if "index_map" not in ref and ref["memory_space"] != "any":
                    # A whole-array window (no BlockSpec): one block at index 0.
                    ref["index_map"] = [0] * len(ref["shape"])
            if kind == "prefetch":
                ref["values"] = self.prefetch_values[j] if j < len(self.prefetch_values) else {"runtime": nm}
            elif kind == "input" and ms == "smem" and (j - nprefetch) in self.smem_input_values:
                ref["values"] = self.smem_input_values[j - nprefetch]
            self.refs[self._key(arg)] = len(refs)
            kinds.append(kind)
            names.append(nm)
            refs.append(ref)
        self.ref_kinds, self.ref_names = kinds, names
        self.ref_spaces = [r["memory_space"] for r in refs]
        self.tables = {i for i, r in enumerate(refs) if "values" in r}
        # SMEM refs the kernel stores to: their loads are ops read in program order.
        self.mutable = set()

        def scan(o):
            if o.operation.name == "memref.store":
                ri = self.refs.get(self._key(o.operation.operands[1]))
                if ri is not None:
                    self.mutable.add(ri)

        for o in block.operations:
            scan(o)
            _walk(o.operation, scan)
        body = self.body_ops(block, 0)
        return {
            "grid": grid,
            "dimension_semantics": sem,
            "refs": refs,
            "body": body,
            "allocations": self.allocations,
        }


def _yielded(region, i):
    """The scalar expression a region's `scf.yield` yields at position `i`."""
    for y in reversed(region):
        if y.get("op") == "scf.yield":
            ops = y.get("operands", [])
            if i < len(ops) and isinstance(ops[i], dict) and "scalar" in ops[i]:
                return ops[i]["scalar"]
    return ["unknown", "a value yielded by a branch"]


def _affine_expr(e, kernel, ref_name):
    """An MLIR affine expression (of a window's affine index map) as a description expression:
    constants, grid indices (`d0`, ...), `+`, `*`, `floordiv`, `ceildiv` and `mod` (the
    remainder of floor division: at least 0 for a positive divisor)."""
    _, _, ir, _ = _ir()
    for cls in (ir.AffineConstantExpr, ir.AffineDimExpr, ir.AffineAddExpr, ir.AffineMulExpr, ir.AffineFloorDivExpr, ir.AffineCeilDivExpr, ir.AffineModExpr):
        try:
            x = cls(e)
        except Exception:
            continue
        if cls is ir.AffineConstantExpr:
            return int(x.value)
        if cls is ir.AffineDimExpr:
            return ["grid", int(x.position)]
        a, b = _affine_expr(x.lhs, kernel, ref_name), _affine_expr(x.rhs, kernel, ref_name)
        if cls is ir.AffineModExpr:
            return ["sub", a, ["mul", ["floordiv", a, b], b]]
        return [{ir.AffineAddExpr: "add", ir.AffineMulExpr: "mul", ir.AffineFloorDivExpr: "floordiv", ir.AffineCeilDivExpr: "ceildiv"}[cls], a, b]
    raise InputError(f"kernel `{kernel}`: the index map of `{ref_name}` holds the affine expression `{e}`, which tpusim.jax does not read (it reads constants, grid indices, +, *, floordiv, ceildiv and mod)")


_VECTOR_SIDE_EFFECTS = {"tpu.vector_store", "vector.store", "tpu.store", "tpu.strided_store", "tpu.enqueue_dma", "tpu.wait_dma2", "tpu.wait_dma", "tpu.sem_signal", "tpu.sem_wait"}
_SCALAR_FREE = {"memref.store", "tpu.trace_start", "tpu.trace_stop", "tpu.assume_multiple", "tpu.yield", "tpu.log"}


#: The attributes of the kernel function the reader knows: None (any value) or the values it
#: models. `tpu.core_type` (JAX 0.10.0 and later) names the core the kernel runs on: a
#: TensorCore kernel is modelled, a SparseCore one is not.
_KERNEL_ATTRS = {
    "sym_name": None, "function_type": None, "arg_attrs": None, "res_attrs": None, "iteration_bounds": None,
    "dimension_semantics": None, "scalar_prefetch": None, "scratch_operands": None, "window_params": None,
    "tpu.core_type": ("#tpu.core_type<tc>",),
}

#: Stores: an older release's identity cast of the value one stores is dropped (`_old_shape_cast`).
_STORES = {"tpu.vector_store", "vector.store", "tpu.store", "tpu.strided_store"}

#: Ops an older release emits that the reader rewrites into the newest release's form
#: (`JAX_CHANGES`): op -> (the first release that no longer emits it, or None for an op rewritten
#: under every release; the reader's method, which returns False for an instance it leaves as it is).
_REWRITES = {
    "tpu.repeat": (None, "_repeat"),
    "vector.shape_cast": ("0.9.1", "_old_shape_cast"),
    "vector.transpose": ("0.9.1", "_old_transpose"),
    "vector.broadcast": ("0.9.1", "_old_bool_broadcast"),
    "arith.cmpi": ("0.9.1", "_old_bool_broadcast"),
}

_FALSE = ("false",)
_FAST = {"fastmath": None}
_OVERFLOW = {"overflowFlags": None}

#: The ops the reader knows and, for each, the attributes it knows: attribute -> None (any value:
#: the reader reads it, or it does not change the op's work) or the values the op is modelled at
#: (another value is refused, naming it). The vector and side-effect ops are the ones the cost
#: table of the Rust side prices (`crates/tpusim-kernel/src/body/cost.rs`; a test keeps the two
#: equal), with the control flow and views the reader reads itself. An op with a vector result or
#: a side effect that is not listed, or an attribute not listed for its op, is an error naming
#: the op, the kernel, the source line and the JAX release (`_Reader._check_known`); attributes
#: are the Mosaic `tpu` dialect's and MLIR's (`arith`, `math`, `vector`, `scf`, `memref`) as the
#: tested releases print them.
_OP_ATTRS = {
    # Free: constants, layout, loads and stores, views, semaphores, markers.
    "arith.constant": {"value": None},
    "arith.bitcast": {},
    "vector.broadcast": {},
    "vector.splat": {},
    "vector.shape_cast": {},
    "vector.extract": {"static_position": None},
    "vector.extract_strided_slice": {"offsets": None, "sizes": None, "strides": None},
    "vector.insert_strided_slice": {"offsets": None, "strides": None},
    "vector.load": {"nontemporal": _FALSE},
    "vector.store": {"nontemporal": _FALSE},
    "vector.create_mask": {},
    "tpu.reshape": {},
    "tpu.bitcast": {},
    "tpu.concatenate": {"dimension": None},
    "tpu.repeat": {"dimension": None, "times": None},
    "tpu.iota": {"dimensions": None},
    "tpu.load": {"sublane_mask": None, "sublane_stride": None},
    "tpu.strided_load": {"strides": None},
    # A store that adds to memory (`add`) reads it as well: not modelled.
    "tpu.vector_store": {"strides": None, "add": _FALSE, "operandSegmentSizes": None},
    "tpu.store": {"sublane_mask": None, "sublane_stride": None, "add": _FALSE, "operandSegmentSizes": None},
    "tpu.strided_store": {"strides": None},
    "tpu.create_mask": {},
    "tpu.memref_slice": {"operandSegmentSizes": None},
    "tpu.memref_squeeze": {},
    "tpu.memref_reshape": {},
    "tpu.memref_bitcast": {},
    "tpu.reinterpret_cast": {"operandSegmentSizes": None},
    "tpu.assume_multiple": {"multiple": None},
    "tpu.assume_layout": {},
    "tpu.erase_memref_layout": {},
    "tpu.sem_wait": {},
    "tpu.sem_signal": {"operandSegmentSizes": None, "core_type": None},
    "tpu.sem_alloc": {},
    "tpu.trace_start": {"level": None, "message": None},
    "tpu.trace_stop": {},
    "tpu.yield": {},
    # VPU: element-wise arithmetic, comparisons, selects, conversions.
    **{f"arith.{o}": dict(_FAST) for o in ("addf", "subf", "mulf", "negf", "maximumf", "minimumf", "maxnumf", "minnumf", "extf")},
    "arith.truncf": {"fastmath": None, "roundingmode": None},
    "arith.cmpf": {"fastmath": None, "predicate": None},
    **{f"arith.{o}": dict(_OVERFLOW) for o in ("addi", "subi", "muli", "shli", "trunci")},
    **{f"arith.{o}": {} for o in ("andi", "ori", "xori", "shrui", "shrsi", "maxsi", "minsi", "maxui", "minui", "select", "extsi", "extui",
                                   "sitofp", "uitofp", "fptosi", "fptoui", "divsi", "divui", "floordivsi", "remsi", "remui")},
    "arith.cmpi": {"predicate": None},
    "tpu.extf": {},
    "tpu.truncf": {"rounding_mode": None},
    "tpu.sitofp": {"rounding_mode": None},
    "tpu.fptosi": {"rounding_mode": None},
    **{f"math.{o}": dict(_FAST) for o in ("absf", "copysign", "floor", "ceil", "roundeven", "round", "fma")},
    "math.absi": {},
    # EUP.
    **{f"math.{o}": dict(_FAST) for o in ("exp", "exp2", "log", "log2", "log1p", "tanh", "rsqrt", "sqrt", "powf")},
    "arith.divf": dict(_FAST),
    "tpu.reciprocal": {"approx": None, "full_range": None},
    # XLU.
    "tpu.transpose": {"permutation": None},
    "vector.transpose": {"permutation": None},
    "tpu.dynamic_rotate": {"dimension": None, "stride": None, "stride_dimension": None},
    "tpu.rotate": {"amount": None, "dimension": None, "stride": None, "stride_dimension": None},
    "vector.multi_reduction": {"kind": None, "reduction_dims": None},
    # MXU: a transposed lhs (`transpose_lhs`, or the hint JAX 0.10.1 added) is not modelled.
    "tpu.matmul": {"dimension_numbers": None, "precision": None, "transpose_lhs": _FALSE, "transpose_rhs": None, "transpose_lhs_hint": _FALSE},
    "vector.contract": {"indexing_maps": None, "iterator_types": None, "kind": None},
    # DMA engines.
    "tpu.enqueue_dma": {"operandSegmentSizes": None, "priority": None, "strict_ordering": None, "core_type": None},
    "tpu.wait_dma": {"operandSegmentSizes": None, "priority": None, "strict_ordering": None},
    "tpu.wait_dma2": {"operandSegmentSizes": None, "strict_ordering": None, "core_type": None},
    # Packed int8 data widened (a loaded mask block).
    "tpu.unpack_subelements": {"index": None, "pack_format": None, "sign_extended": None, "integer_extended": None, "unsigned_integers": None},
    # Control flow, SMEM state and scalar work the reader reads itself.
    "scf.if": {},
    "scf.for": {},
    "scf.while": {},
    "scf.yield": {},
    "scf.condition": {},
    "tpu.region": {},
    "memref.load": {"nontemporal": _FALSE},
    "memref.store": {"nontemporal": _FALSE},
    "tpu.iteration_bound": {"dim": None},
}

#: The ops of `_OP_ATTRS` the reader reads itself (control flow, SMEM state, `pl.num_programs`)
#: or rewrites (`_REWRITES`): the others are the Rust cost table's.
_READ_BY_THE_READER = {
    "scf.if", "scf.for", "scf.while", "scf.yield", "scf.condition", "tpu.region", "memref.load", "memref.store",
    "tpu.iteration_bound", "tpu.repeat",
}


def _is_vector(t):
    s = str(t)
    return s.startswith("vector<")


def _ints(a):
    _, _, ir, _ = _ir()
    for cls in (ir.DenseI64ArrayAttr, ir.DenseI32ArrayAttr):
        try:
            return list(cls(a))
        except Exception:
            pass
    try:
        return [ir.IntegerAttr(x).value for x in ir.ArrayAttr(a)]
    except Exception:
        return []


def _dict_attr(a):
    _, _, ir, _ = _ir()
    d = ir.DictAttr(a)
    return {d[i].name: d[i].attr for i in range(len(d))}


def _bytes(dtype):
    if dtype in ("f64", "i64"):
        return 8
    if dtype in ("f32", "i32", "ui32"):
        return 4
    if dtype in ("bf16", "f16", "i16"):
        return 2
    return 1


def _matmul_attrs(op):
    """m, k, n (and batch) of a tpu.matmul from its operand shapes and dimension numbers."""
    lhs, lt = _shape_dtype(op.operands[0].type)
    rhs, rt = _shape_dtype(op.operands[1].type)
    out, _ = _shape_dtype(op.results[0].type)
    a = op.attributes
    contract_l, contract_r = [len(lhs) - 1], [0]
    batch_l = []
    if "dimension_numbers" in a:
        s = str(a["dimension_numbers"])
        import re

        lists = re.findall(r"\[([0-9, ]*)\]", s)
        if len(lists) >= 4:
            contract_l = [int(x) for x in lists[0].split(",") if x.strip()]
            contract_r = [int(x) for x in lists[1].split(",") if x.strip()]
        if len(lists) >= 7:
            batch_l = [int(x) for x in lists[5].split(",") if x.strip()]
    elif "transpose_rhs" in a and "true" in str(a["transpose_rhs"]):
        contract_r = [len(rhs) - 1]
    k = 1
    for c in contract_l:
        k *= lhs[c]
    batch = 1
    for b in batch_l:
        batch *= lhs[b]
    m = 1
    for i, s in enumerate(lhs):
        if i not in contract_l and i not in batch_l:
            m *= s
    total = 1
    for s in out:
        total *= s
    n = total // max(m * batch, 1)
    attrs = {"mkn": [m, k, n], "lhs_dtype": lt, "rhs_dtype": rt, "rhs_contracting": contract_r}
    if batch > 1:
        attrs["batch"] = batch
    if "precision" in a:
        attrs["precision"] = str(a["precision"]).split("<")[-1].rstrip(">")
    return attrs


def _kernels(exported, args, operands=None):
    """Each Pallas kernel of an export (description dicts) and the XLA ops outside them (names).
    `operands`: a function giving each call's operand values (`_call_operands`), asked only when
    a kernel has an operand the export's constants and arguments do not give."""
    _, _, ir, _ = _ir()
    with _context(), ir.Location.unknown():
        module = ir.Module.parse(exported.mlir_module())
        out, outside, _ = _kernels_of(module, args, operands)
    return out, outside


def _kernels_of(module, args, operands=None):
    """The kernel descriptions of a parsed export's tpu_custom_calls (in `_find_calls` order), the
    XLA ops outside them, and the custom-call ops themselves (aligned with the descriptions).

    A call's operands are its dynamic grid sizes (one per `?` of `iteration_bounds`), then its
    scalar-prefetch tables, then its inputs. A value that is neither a constant nor an argument
    of the function (computed by XLA ops before the kernel) is taken from `operands()` (the
    function run on the host CPU), else a grid size is an error naming the kernel and dimension
    and a table is a runtime operand."""
    import numpy as np

    jmlir, jtpu, ir, passmanager = _ir()
    jax = _jax()
    release = _release(jax)
    args = jax.tree.leaves(list(args))  # main's arguments are the flattened leaves
    out = []
    skipped = []  # kernels that run no grid step (left out)
    kept_ops = []  # the custom calls of the kernels described (aligned with `out`)
    computed = []  # operands() once asked: a list per call, or None

    def computed_value(ci, i):
        if operands is None:
            return None
        if not computed:
            computed.append(operands())
        vals = computed[0]
        if vals is None or len(vals) != len(calls) or i >= len(vals[ci]) or vals[ci][i] is _UNKNOWN:
            return None
        return np.asarray(vals[ci][i])

    if True:
        calls, funcs, call_sites, others = _find_calls(module)
        for ci, c in enumerate(calls):
            op = c.op
            bc = json.loads(op.attributes["backend_config"].value)
            cfg = bc.get("custom_call_config", bc)
            body = base64.b64decode(cfg["body"])
            kmod = ir.Module.parse(body)
            passmanager.PassManager.parse("builtin.module(mosaic-serde{serialize=false})").run(kmod.operation)
            name = op.attributes["kernel_name"].value if "kernel_name" in op.attributes else "pallas_kernel"
            meta = None
            if "mhlo.frontend_attributes" in op.attributes:
                fa = _dict_attr(op.attributes["mhlo.frontend_attributes"])
                if "kernel_metadata" in fa:
                    meta = ir.StringAttr(fa["kernel_metadata"]).value
            # Scoped VMEM limit (memory space 1 = VMEM).
            vmem_limit = None
            for m in bc.get("scoped_memory_configs", []) or []:
                if int(m.get("memory_space", -1)) == 1 and "size" in m:
                    vmem_limit = int(m["size"])
            # A kernel's own pl.CostEstimate: in the backend config's custom_call_config (JAX
            # 0.10) or at its top level (earlier JAX).
            cost = (bc.get("custom_call_config") or {}).get("cost_estimate") or bc.get("cost_estimate")
            version = None
            if "stable_mosaic.version" in kmod.operation.attributes:
                version = ir.IntegerAttr(kmod.operation.attributes["stable_mosaic.version"]).value
            # Values of the scalar-prefetch operands (the first operands of the call).
            kf = None
            for f in kmod.body.operations:
                if f.operation.name == "func.func" and _is_kernel_func(f):
                    kf = f
                    break
            nprefetch = 0
            if kf is not None and "scalar_prefetch" in kf.attributes:
                nprefetch = ir.IntegerAttr(kf.attributes["scalar_prefetch"]).value
            bounds = list(_ints(kf.attributes["iteration_bounds"])) if kf is not None and "iteration_bounds" in kf.attributes else []
            ndyn = sum(1 for b in bounds if b < 0)
            grid_values = []
            for i in range(ndyn):
                val, why = _value_of(op.operands[i], funcs, call_sites, args)
                if val is None:
                    val = computed_value(ci, i)
                if val is None or np.asarray(val).size != 1:
                    dim = [k for k, b in enumerate(bounds) if b < 0][i]
                    raise InputError(
                        f"kernel `{name}`: grid dimension {dim} is sized at run time (a dynamic grid, operand {i} of the call: {why}), "
                        "and its size could not be computed: pass concrete arrays (not jax.ShapeDtypeStruct) for the arguments it is "
                        "computed from (e.g. a grouped matmul's group_sizes; weights may stay shapes), so that tpusim.jax runs the XLA ops "
                        "that compute it on the host CPU"
                    )
                grid_values.append(int(np.asarray(val).reshape(-1)[0]))
            prefetch = []
            for i in range(nprefetch):
                val, why = _value_of(op.operands[ndyn + i], funcs, call_sites, args)
                if val is None:
                    val = computed_value(ci, ndyn + i)
                if val is None:
                    import re

                    m = re.match(r"argument `([^`]+)` of the function", why or "")
                    prefetch.append({"runtime": m.group(1) if m else f"prefetch operand {i} of {name} ({why})"})
                else:
                    prefetch.append({"inline": [int(x) for x in np.asarray(val).reshape(-1)]})
            n_in = len(op.operands) - nprefetch - ndyn
            n_out = len(op.results)
            # Integer inputs the call passes in SMEM (a grid-less pallas_call's or a pl.kernel's
            # `pltpu.SMEM` operands: group sizes, metadata tables computed by XLA ops): their
            # values, found as the prefetch tables' are, so that the branches, loop bounds and
            # copies that read them are evaluated; one not found is a runtime operand.
            smem_inputs = {}
            kargs = list(kf.regions[0].blocks[0].arguments) if kf is not None else []
            for w in range(n_in):
                j = len(bounds) + nprefetch + w
                if j >= len(kargs) or _memspace(kargs[j].type) != "smem":
                    continue
                _, dt = _shape_dtype(kargs[j].type)
                if not (dt.startswith("i") or dt.startswith("ui")):
                    continue
                i = ndyn + nprefetch + w
                val, why = _value_of(op.operands[i], funcs, call_sites, args)
                if val is None:
                    val = computed_value(ci, i)
                if val is None:
                    import re

                    m = re.match(r"argument `([^`]+)` of the function", why or "")
                    smem_inputs[w] = {"runtime": m.group(1) if m else f"SMEM input {w} of {name} ({why})"}
                else:
                    smem_inputs[w] = {"inline": [int(x) for x in np.asarray(val).reshape(-1)]}
            reader = _Reader(kmod, name, prefetch, release, smem_inputs)
            it = iter(grid_values)
            reader.grid_sizes = [b if b >= 0 else next(it) for b in bounds]
            desc = reader.read((n_in, n_out))
            desc["grid"] = list(reader.grid_sizes) if len(reader.grid_sizes) == len(desc["grid"]) else desc["grid"]
            if any(b < 1 for b in desc["grid"]):
                # A call that runs no grid step (a dynamic grid computed as 0: a grouped matmul
                # whose groups are all empty, ragged attention's empty decode or prefill call):
                # nothing to simulate; the function's other kernels are described.
                import warnings

                zero = [i for i, b in enumerate(desc["grid"]) if b < 1]
                dynamic = [i for i in zero if i < len(bounds) and bounds[i] < 0]
                why = (
                    f"a dynamic dimension computed as {grid_values} from these arguments"
                    if dynamic
                    else f"dimension {zero[0]} is 0 in the lowering itself, e.g. an array dimension smaller than its block (a grid of size // block)"
                )
                warnings.warn(
                    f"kernel `{name}`: grid {desc['grid']} ({why}) runs no grid step; "
                    "it is left out (tpusim simulates calls of at least one step)",
                    stacklevel=3,
                )
                skipped.append(name)
                continue
            full = {
                "format": "tpusim-kernel-description",
                "version": DESCRIPTION_VERSION,
                "kernel_name": name,
                "kernel_metadata": meta,
                "producer": {"tool": "tpusim.jax", "jax": release.version, "device_kind": "", "mosaic_version": version},
                "grid": desc["grid"],
                "dimension_semantics": [s if s in ("parallel", "arbitrary", "core_parallel") else "arbitrary" for s in desc["dimension_semantics"]],
                "vmem_limit_bytes": vmem_limit,
                "cost_estimate": {k: float(v) for k, v in cost.items() if k in ("flops", "transcendentals", "bytes_accessed")} if cost else None,
                "refs": desc["refs"],
                "body": desc["body"],
            }
            if desc["allocations"]:
                full["allocations"] = desc["allocations"]
            # The library kernel family, from the kernel name and its ops' source files with their
            # folders (the description's `loc` keeps file names only): the band a report quotes.
            family = _tpusim._kernel_family(name, _source_files(kmod))
            if family is not None:
                full["family"] = family
            # Array shapes of the windows, from the call's operands and results.
            shapes = [list(ir.RankedTensorType(x.type).shape) for x in list(op.operands)[ndyn + nprefetch:]] + [
                list(ir.RankedTensorType(x.type).shape) for x in op.results
            ]
            w = 0
            for r in full["refs"]:
                if r["kind"] in ("input", "output"):
                    if w < len(shapes):
                        r["array_shape"] = shapes[w]
                    w += 1
            loop = _enclosing_loop(op, funcs, call_sites)
            if loop is not None:
                import warnings

                warnings.warn(
                    f"kernel `{name}` is called inside a loop (`stablehlo.while` at {_loc(loop, release)}: a fori_loop, scan or while_loop): "
                    "its report is one call; the loop runs it once per iteration, so multiply by the trip count",
                    stacklevel=3,
                )
            out.append(full)
            kept_ops.append(op)
    if calls and not out and skipped:
        raise InputError(
            f"every Pallas kernel of the function runs no grid step ({', '.join(f'`{n}`' for n in skipped)}: a grid dimension of 0, static (an array "
            "dimension smaller than its block, size // block) or dynamic (computed from these arguments, e.g. a grouped matmul whose groups "
            "are all empty), as the warnings say), so there is nothing to simulate; tpusim simulates calls of at least one step"
        )
    outside = sorted({n for n in others if n.startswith("stablehlo.") and n not in ("stablehlo.constant",)})
    return out, outside, kept_ops


_CALLS = ("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr", "custom_vmap_call", "remat", "checkpoint")


def _sub_jaxpr(eqn):
    """The (jaxpr, consts) a call-like equation runs on its operands, or None."""
    if eqn.primitive.name not in _CALLS:
        return None
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr", "call"):
        j = eqn.params.get(key)
        if j is None:
            continue
        if hasattr(j, "jaxpr"):  # a ClosedJaxpr
            return j.jaxpr, list(j.consts)
        return j, []
    return None


def _has_pallas(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            return True
        sub = _sub_jaxpr(eqn)
        if sub is not None and _has_pallas(sub[0]):
            return True
    return False


class _Unknown:
    """A value the host evaluation does not have: a shape-only argument (`jax.ShapeDtypeStruct`)
    and everything computed from it. A table or grid size it reaches stays a runtime value,
    never a made-up one."""


_UNKNOWN = _Unknown()


def _eval_to_calls(jaxpr, consts, vals, found):
    """Runs `jaxpr` on concrete values with JAX's own ops (on the host CPU), recording the operand
    values of each `pallas_call` (in program order) instead of running it (its results are zeros:
    a value computed from a kernel's output is not a value the description can use). A value in
    `vals` may be `_UNKNOWN` (a shape-only argument): an op with an unknown operand is not run and
    its results are unknown."""
    import numpy as np

    env = {}

    def read(v):
        return v.val if type(v).__name__ == "Literal" else env[v]

    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, vals):
        env[v] = x
    for eqn in jaxpr.eqns:
        ins = [read(v) for v in eqn.invars]
        sub = _sub_jaxpr(eqn)
        if eqn.primitive.name == "pallas_call":
            found.append(ins)
            outs = [np.zeros(v.aval.shape, v.aval.dtype) for v in eqn.outvars]
        elif sub is not None and _has_pallas(sub[0]):
            j, c = sub
            outs = _eval_to_calls(j, c, ins[len(ins) - len(j.invars):], found)
        elif any(x is _UNKNOWN for x in ins):
            outs = [_UNKNOWN] * len(eqn.outvars)
        else:
            outs = eqn.primitive.bind(*ins, **eqn.params)
            if not eqn.primitive.multiple_results:
                outs = [outs]
        for v, x in zip(eqn.outvars, outs):
            if type(v).__name__ != "DropVar":
                env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _call_operands(fn, args, mesh):
    """The operand values of each `pallas_call` in `fn(*args)`, in program order: the dynamic grid
    sizes, scalar-prefetch tables and inputs as the jitted function computes them from concrete
    `args` (XLA ops before the kernel, such as megablox's group metadata, run on the host CPU with
    JAX). None when an argument is a shape only or the function cannot run so (the description
    then marks what it could not evaluate as runtime values). A shape-only argument
    (`jax.ShapeDtypeStruct`, e.g. a model's weights) is not evaluated: what is computed from it
    stays unknown (`_UNKNOWN`), and what is not (group metadata from a concrete `group_sizes`) is
    computed."""
    jax = _jax()
    leaves = jax.tree.leaves(list(args))
    if any(not isinstance(a, jax.ShapeDtypeStruct) and not hasattr(a, "__array__") for a in leaves):
        return None
    if all(isinstance(a, jax.ShapeDtypeStruct) for a in leaves):
        return None
    leaves = [_UNKNOWN if isinstance(a, jax.ShapeDtypeStruct) else a for a in leaves]
    try:
        with jax.sharding.use_abstract_mesh(mesh):
            closed = jax.make_jaxpr(fn)(*args)
        jaxpr = closed.jaxpr
        if not jaxpr.constvars:
            # The export holds only the kernels whose results are used (a gradient's forward
            # kernel is dropped): the calls found must be those, in the same order.
            from jax._src.interpreters import partial_eval as pe

            jaxpr, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars), instantiate=True)
        found = []
        _eval_to_calls(jaxpr, list(closed.consts), leaves, found)
        return found
    except Exception:
        return None


def _family_arg(family):
    """The `family` keyword of `describe`, `describe_all` and `simulate`, checked: `None` or a
    kernel family word (the rule a description's `family` is read by, `DESCRIPTION.md`)."""
    if family is None:
        return None
    why = _tpusim._family_word_rule(family if isinstance(family, str) else "")
    if why is None:
        return family
    raise InputError(f"family = {family!r}: {why}; the families with their own error band are listed in traces/measured/kernels/README.md")


def describe_all(fn, *args, chip="v6e", device_kind=None, family=None):
    """The kernel descriptions (dicts) of every Pallas kernel in `fn(*args)`, and the XLA ops
    outside them (names), lowered for `chip`. Each records its library kernel `family` when
    tpusim recognises it (traces/measured/kernels/README.md states the rule), or `family` when
    given (for every kernel of the call): a label, which selects the error band a report quotes
    and never the simulation."""
    family = _family_arg(family)
    exported = lower(fn, *args, chip=chip, device_kind=device_kind)
    descs, outside = _kernels(exported, args, lambda: _call_operands(fn, args, _mesh_for(chip, device_kind)))
    kind, _ = _device_kind(chip, device_kind)
    for d in descs:
        d["producer"]["device_kind"] = kind
        if family is not None:
            d["family"] = family
    if not descs:
        raise InputError(
            "the function has no Pallas kernel (no tpu_custom_call in its TPU lowering): tpusim.jax simulates "
            "pl.pallas_call kernels; tpusim.jax.simulate_program(fn, *args) times a whole program, XLA ops included"
        )
    return descs, outside


#: The command a kernel description's mark names (`tpusim_io::mark::DESCRIBE_COMMAND`): a file
#: with `"format": "tpusim-kernel-description"` and `"producer": {"tool": "tpusim.jax"}`.
DESCRIBE_COMMAND = "tpusim.jax.describe"
#: The command a decode sweep's CSV mark names (`tpusim_io::mark::DECODE_SWEEP_COMMAND`).
DECODE_SWEEP_COMMAND = "tpusim.jax.decode_sweep"


def _force_arg(force):
    """The `force` keyword every writer takes, checked: a bool."""
    if not isinstance(force, bool):
        raise InputError(f"force = {force!r}: expected True or False (True replaces an existing file tpusim did not write)")
    return force


def _output_path(path, arg, what, example):
    """A writer's path argument, checked before any work: a str or os.PathLike naming a file in a
    folder that exists. Returns it as a str."""
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"{arg} = {path!r}: expected a file path (str or os.PathLike) for {what}, e.g. {arg}={example!r}")
    path = os.fspath(path)
    if os.path.isdir(path):
        raise InputError(f"{arg} = {path!r}: is a directory; give a file path for {what}, e.g. {os.path.join(path, example)!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"{arg} = {path!r}: its directory {folder!r} does not exist; create it first or choose another path")
    return path


def _planned(desc, path):
    """The files one description is written as: `(path, bytes)` of the description itself and a
    list of `(path, bytes)` of its side files. Compact JSON with large prefetch tables as .npy
    side files beside it, or for a path ending in .gz one gzip-compressed file with every table
    inline."""
    import io

    import numpy as np

    stem = os.path.basename(path)
    for ext in (".gz", ".json"):
        stem = stem[: -len(ext)] if stem.endswith(ext) else stem
    folder = os.path.dirname(os.path.abspath(path))
    d = json.loads(json.dumps(desc))
    packed = path.endswith(".gz")
    sides = []
    for i, r in enumerate(d["refs"]):
        v = r.get("values")
        # A compressed description keeps its tables inline (one file); a plain one moves large
        # tables to .npy side files.
        if v and "inline" in v and len(v["inline"]) > INLINE_TABLE_LIMIT and not packed:
            side = f"{stem}.prefetch{i}.npy"
            buf = io.BytesIO()
            np.save(buf, _side_file_array(v["inline"], r.get("dtype")).reshape(r["shape"]))
            sides.append((os.path.join(folder, side), buf.getvalue()))
            r["values"] = {"file": side}
    # Compact JSON (a serving kernel's copy sizes are deep expression trees); gzip-compressed for
    # a path ending in .gz (tpusim reads either).
    text = json.dumps(d, separators=(",", ":")).encode()
    if packed:
        import gzip

        text = gzip.compress(text, mtime=0)
    return (path, text), sides


def _write_all(plans, force):
    """Writes planned descriptions (`_planned`) after checking every file they write: each
    description, and each side file beside the description that names it. Returns their paths."""
    targets = [t for (p, _), sides in plans for t in [(p, None)] + [(s, p) for s, _ in sides]]
    _tpusim._check_outputs("path", DESCRIBE_COMMAND, targets, force)
    for (p, text), sides in plans:
        # Side files first: a description is never there without the tables it names.
        for s, data in sides:
            _tpusim._write_output("path", s, data)
        _tpusim._write_output("path", p, text)
    return [p for (p, _), _ in plans]


def _write(desc, path, force=False):
    """Writes one description (a dict of `describe_all`) to `path` as `describe` writes it, under
    the same overwrite rule; returns the path."""
    path = _output_path(path, "path", "the description", "kernel.json")
    return _write_all([_planned(desc, path)], _force_arg(force))[0]


def describe(fn, *args, path, chip="v6e", device_kind=None, force=False, family=None):
    """Writes the kernel description of `fn(*args)` to `path` (JSON; `crates/tpusim-pallas/
    DESCRIPTION.md`; gzip-compressed, tables inline, for a path ending in `.gz`, as
    `kernel.json.gz`: serving kernels' copy sizes are large expressions). With several kernels,
    the second and later go to `path` with `.1`, `.2`, ... before the extension. Prefetch tables
    of more than `INLINE_TABLE_LIMIT` elements go to `.npy` side files beside a plain JSON
    description (`STEM.prefetchN.npy`). Returns the paths of the descriptions written.

    `force` (default `False`): an existing description is replaced only when tpusim wrote it (its
    `"format": "tpusim-kernel-description"` with `producer.tool` `"tpusim.jax"`), and an existing
    side file only beside such a description; any other file is refused with an `InputError`
    naming it, and nothing is written. `force=True` replaces them. Every path is checked before
    the first file is written, and each file is written completely or not at all.

    Values a kernel takes at run time come from the arguments: a scalar-prefetch table or a
    dynamic grid size computed by XLA ops before the kernel (megablox `gmm`'s group metadata) is
    evaluated on the host CPU from concrete arrays; a copy sized at run time is written as an
    expression over the table that sizes it. An argument given as a `jax.ShapeDtypeStruct`
    leaves the tables it feeds as runtime operands (`--runtime NAME=FILE.npy`) and a dynamic
    grid computed from it an error naming the kernel and dimension.

    `family` (default `None`): the library kernel family to record (`describe_all`), for a
    kernel tpusim does not recognise; the report then quotes that family's error band."""
    # The path first: a bad one, or a file tpusim did not write, is refused before the lowering,
    # naming what the user gave.
    path = _output_path(path, "path", "the description", "kernel.json")
    force = _force_arg(force)
    _tpusim._check_outputs("path", DESCRIBE_COMMAND, [(path, None)], force)
    family = _family_arg(family)
    descs, _ = describe_all(fn, *args, chip=chip, device_kind=device_kind, family=family)
    base, ext = os.path.splitext(path)
    if ext == ".gz" and base.endswith(".json"):
        base, ext = base[: -len(".json")], ".json.gz"
    # Every file this call writes is checked before the first is written.
    return _write_all([_planned(d, path if i == 0 else f"{base}.{i}{ext}") for i, d in enumerate(descs)], force)


def simulate(fn, *args, chip="v6e", device_kind=None, set=None, family=None, **options):
    """Simulates every Pallas kernel of `fn(*args)` on `chip` (a preset name; `set` a dict or list
    of `SECTION.FIELD=VALUE` what-if overrides). Returns a `CallReport`: `.kernels` (one
    `tpusim.Report` per kernel, in call order), `.latency_ms` (their sum), `.not_simulated`
    (the XLA ops outside the kernels, listed, not timed).

    Each is the `tpusim.Report` that `tpusim.simulate` returns, from the same run and report code:
    the same metrics by the same names with the same meanings (`latency_ms`, `cycles`, `flops`,
    `transcendentals`, `hbm_bytes`, `mfu`, `bottleneck` and `co_bound` from the what-if 2x table,
    `what_if_2x`, `cost_estimate`, `band`, `grid_steps`, `steps_computed` (the grid steps whose body
    does MXU work, or in a kernel without MXU work any unit work: not those that only initialize or
    finalize an output; the count `tpusim.simulate` gives a hand-modelled kernel), `vmem_bytes`, ...). Its
    `job` is `{"kind": "described", "file", "kernel_name", "device_kind"}`, it adds
    `declared_cost_estimate`, `smem_bytes` and `assumptions` (what the IR path assumed), and it has
    no attention-only fields (masks, densities, the dense baseline): reading one raises an
    `AttributeError` saying so. `family` names the kernels' library family where tpusim does not
    recognise it (`describe_all`): the band is then that family's."""
    if options:
        raise InputError(
            f"{', '.join(sorted(options))}: not options of tpusim.jax.simulate (the lowering fixes the workload, "
            "mask and block sizes; use chip=, device_kind=, set=, family=)"
        )
    descs, outside = describe_all(fn, *args, chip=chip, device_kind=device_kind, family=_family_arg(family))
    overrides = _overrides(set)
    reports = [_tpusim.simulate_kernel_ir(json.dumps(d), chip=chip, set=overrides) for d in descs]
    return CallReport(reports, outside)


def describe_program(fn, *args, chip="v6e", device_kind=None, mesh=None):
    """The program description (a dict; `crates/tpusim-program/PROGRAM.md`) of `fn(*args)`: its
    XLA ops, collectives and Pallas kernels (`tpusim.program`)."""
    from .program import describe_program as d

    return d(fn, *args, chip=chip, device_kind=device_kind, mesh=mesh)


def simulate_program(fn, *args, chip="v6e", device_kind=None, mesh=None, slice=None, set=None):
    """Simulates the whole program of `fn(*args)` on one chip of `slice` (`"2x4"`, default the
    shape of `mesh`): fusions, dots, collectives and Pallas kernels, scheduled with asynchronous
    collectives (crate `tpusim-program`). Returns a `ProgramReport` (`tpusim.program`)."""
    from .program import simulate_program as s

    return s(fn, *args, chip=chip, device_kind=device_kind, mesh=mesh, slice=slice, set=set)


def _overrides(s):
    """`set=` as a list of `SECTION.FIELD=VALUE` strings: None, one such string, a dict
    {field: value} or a list of strings (as `tpusim.simulate` takes it)."""
    if s is None:
        return []
    if isinstance(s, str):
        return [s]
    if isinstance(s, dict):
        return [f"{k}={v}" for k, v in s.items()]
    if isinstance(s, (list, tuple)) and all(isinstance(x, str) for x in s):
        return list(s)
    raise InputError(
        f"set = {s!r}: expected 'SECTION.FIELD=VALUE', a list of them or a dict {{'SECTION.FIELD': value}}, "
        "e.g. set={'hbm.bandwidth_gb_per_s': 3276}"
    )


class CallReport:
    """The simulated kernels of one call."""

    def __init__(self, kernels, not_simulated):
        self.kernels = kernels
        self.not_simulated = not_simulated

    @property
    def latency_ms(self):
        """Sum of the kernels' latencies (the XLA ops outside them are not simulated)."""
        return sum(k.latency_ms for k in self.kernels)

    def __getitem__(self, i):
        return self.kernels[i]

    def __len__(self):
        return len(self.kernels)

    def __getattr__(self, name):
        # Only for names a CallReport lacks: a kernel's own field says where it lives.
        kernels = self.__dict__.get("kernels") or []
        if not name.startswith("_") and kernels and hasattr(kernels[0], name):
            raise AttributeError(
                f"CallReport has no field '{name}': it holds one Report per kernel of the call ({len(kernels)} here); "
                f"use report.kernels[i].{name} (or report[i].{name}); report.latency_ms sums the kernels'"
            )
        raise AttributeError(f"CallReport has no field '{name}' (its fields: kernels, not_simulated, latency_ms)")

    def __str__(self):
        parts = [str(k) for k in self.kernels]
        if self.not_simulated:
            parts.append(
                "not simulated (XLA ops outside the kernels; tpusim.jax.simulate_program times them): " + ", ".join(self.not_simulated)
            )
        return "\n".join(parts)


class TuneResult(list):
    """What `tune` returns: a list of (candidate, latency_ms, CallReport), fastest first, with
    `failures`: (candidate, reason) for each candidate that did not lower or simulate."""

    def __init__(self, ranked, failures):
        super().__init__(ranked)
        self.failures = failures


def tune(make_fn, candidates, *args, chip="v6e", device_kind=None, set=None, top=None):
    """Lowers `make_fn(candidate)` for each candidate (block sizes live in the lowering) and
    simulates it; returns a `TuneResult`: [(candidate, latency_ms, CallReport)] fastest first
    (the `top` fastest when given). Candidates that fail (a lowering error, VMEM overflow) are
    left out of the ranking, listed with their reasons in the result's `failures`, and a warning
    says how many failed and why the first did."""
    import warnings

    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or top < 1):
        raise InputError(f"top = {top!r}: expected a whole number from 1 (how many of the fastest to return), or None for all")
    ranked, failures = [], []
    for c in candidates:
        try:
            r = simulate(make_fn(c), *args, chip=chip, device_kind=device_kind, set=set)
            ranked.append((c, r.latency_ms, r))
        except InputError as e:
            failures.append((c, str(e)))
    ranked.sort(key=lambda x: x[1])
    if not ranked:
        if not failures:
            raise InputError("candidates: none given (an empty list); give the block sizes (or other values) make_fn takes")
        raise InputError("no candidate lowered and simulated: " + "; ".join(f"{c!r}: {m}" for c, m in failures[:3]))
    if failures:
        c, m = failures[0]
        warnings.warn(
            f"tune: {len(failures)} of {len(failures) + len(ranked)} candidates were left out of the ranking "
            f"(the result's `failures` lists them); the first, {c!r}: {m}",
            stacklevel=2,
        )
    return TuneResult(ranked[:top] if top else ranked, failures)


# ----------------------------------------------------------------------------------------------
# Decode: paged attention and ragged paged attention steps against the HBM roofline


class DecodeReport:
    """A decode step simulated from its Mosaic IR (`tpusim_job::decode`): `latency_ms`,
    `hbm_bytes`, `must_move_bytes`, `roofline_fraction`, `bound` (the bound that sets the
    latency) and `bounds`, `below_roof` (why the step is below the roof), `dmas`, `kernel` (the
    kernel's own report as a dict); `json` and `str()` the whole report."""

    def __init__(self, json_text, table, kernel_json):
        self.json = json_text
        self.table = table
        self._d = json.loads(json_text)
        self.kernel = json.loads(kernel_json)
        for k, v in self._d.items():
            setattr(self, k, v)

    def __str__(self):
        return self.table

    def __repr__(self):
        return f"<tpusim.jax.DecodeReport {self.latency_ms:.4f} ms, {100 * self.roofline_fraction:.1f}% of the HBM roof>"

    def row(self):
        """The report's scalar fields, for a CSV row."""
        return {
            "latency_ms": self.latency_ms,
            "engine_latency_ms": self.engine_latency_ms,
            "hbm_bytes": self.hbm_bytes,
            "must_move_bytes": self.must_move_bytes,
            "roofline_fraction": self.roofline_fraction,
            "bound": self.bound,
            "dmas": self.dmas["count"],
            "bytes_per_dma": self.bytes_per_dma,
            "grid_steps": self.grid_steps,
        }


def _runtime_array(name, value):
    """A runtime operand's value as an int32 NumPy array; an error names the operand when absent."""
    import numpy as np

    if value is None or type(value).__name__ == "ShapeDtypeStruct" or not hasattr(value, "__array__"):
        raise InputError(
            f"{name}: the decode step needs its values (a NumPy or JAX array), not only a shape: the kernel's "
            "DMAs and loop bounds read it, and nothing is assumed in its place"
        )
    return np.asarray(value)


def _check_lengths(name, lengths, page_indices=None, page_size=None):
    """Sequence lengths as whole numbers from 0, and (with a page table of one row of pages per
    sequence) at most the tokens the table's row holds; an error names the operand, the entry
    and the bound."""
    import numpy as np

    flat = np.asarray(lengths).reshape(-1)
    if flat.size and not np.issubdtype(flat.dtype, np.integer):
        raise InputError(f"{name}: expected whole numbers of tokens, got dtype {flat.dtype}")
    for i, v in enumerate(flat.tolist()):
        if v < 0:
            raise InputError(f"{name}[{i}] = {v}: expected a whole number of tokens from 0")
    if page_indices is not None and page_size is not None:
        pages_per_seq = int(np.asarray(page_indices).shape[-1])
        most = pages_per_seq * int(page_size)
        for i, v in enumerate(flat.tolist()):
            if v > most:
                raise InputError(
                    f"{name}[{i}] = {v}: expected at most {most} tokens (the page table holds {pages_per_seq} pages of "
                    f"{int(page_size)} tokens per sequence)"
                )


def decode(fn, *args, lengths, page_size, kv_bytes_per_page, pages_per_block=None, chip="v6e", device_kind=None, set=None):
    """Simulates the decode kernel in `fn(*args)` (one Pallas kernel; its runtime operands, such as
    sequence lengths and page tables, given as concrete arrays in `args`) and reports it against
    the HBM roofline: `lengths` (KV tokens per sequence), `page_size` (tokens per page),
    `kv_bytes_per_page` (K and V of one page over the KV heads), `pages_per_block` (a label).
    q is the first argument and o the result. Returns a `DecodeReport`."""
    import numpy as np

    lengths = _runtime_array("lengths", lengths)
    _check_lengths("lengths", lengths)
    descs, _ = describe_all(fn, *args, chip=chip, device_kind=device_kind)
    if len(descs) != 1:
        raise InputError(f"the function has {len(descs)} Pallas kernels; a decode step is one kernel")
    d = descs[0]
    q = args[0]
    q_bytes = int(np.prod(q.shape)) * np.dtype(q.dtype).itemsize
    if any(v.get("runtime") for r in d["refs"] if r["kind"] == "prefetch" for v in [r.get("values") or {}] if isinstance(v, dict)):
        missing = [r["values"]["runtime"] for r in d["refs"] if r["kind"] == "prefetch" and "runtime" in (r.get("values") or {})]
        raise InputError(
            f"{', '.join(missing)}: runtime operand(s) of kernel `{d['kernel_name']}` given as shapes only: pass concrete arrays "
            "(sequence lengths and page tables decide which pages the step moves)"
        )
    js, table, kjs = _tpusim.decode_kernel_ir(
        json.dumps(d), [int(x) for x in lengths.reshape(-1)], int(page_size), int(kv_bytes_per_page), int(q_bytes), int(q_bytes),
        pages_per_block=None if pages_per_block is None else int(pages_per_block), chip=chip, set=_overrides(set),
    )
    return DecodeReport(js, table, kjs)


def paged_attention_step(q, k_pages, v_pages, lengths, page_indices, *, pages_per_compute_block, chip="v6e", set=None, **kernel_options):
    """One decode step of JAX's `paged_attention` (jax.experimental.pallas.ops.tpu.paged_attention)
    with the user's `lengths` and `page_indices` (arrays; `q`, `k_pages`, `v_pages` may be
    `jax.ShapeDtypeStruct`s): q [batch, q_heads, head_dim], k/v pages [kv_heads, pages,
    page_size, head_dim]. Returns a `DecodeReport`."""
    import numpy as np
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    lengths = _runtime_array("lengths", lengths)
    page_indices = _runtime_array("page_indices", page_indices)
    kv_heads, _, page_size, head_dim = k_pages.shape
    _check_lengths("lengths", lengths, page_indices, page_size)
    item = np.dtype(k_pages.dtype).itemsize

    def step(q, k_pages, v_pages, lengths, page_indices):
        return paged_attention(q, k_pages, v_pages, lengths, page_indices, pages_per_compute_block=pages_per_compute_block, **kernel_options)

    return decode(
        step, q, k_pages, v_pages, lengths, page_indices, lengths=lengths, page_size=page_size,
        kv_bytes_per_page=2 * kv_heads * page_size * head_dim * item, pages_per_block=pages_per_compute_block, chip=chip, set=set,
    )


def ragged_paged_attention_step(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, *, num_kv_pages_per_block, num_queries_per_block, chip="v6e", set=None, **kernel_options):
    """One step of JAX's ragged paged attention (jax.experimental.pallas.ops.tpu.
    ragged_paged_attention, as JAX 0.9.0 to 0.10.2 have it) with the user's `kv_lens`, `page_indices`, `cu_q_lens` and
    `num_seqs` (arrays): q [tokens, q_heads, head_dim], kv_pages [pages, page_size, 2 x kv_heads,
    head_dim]. Only the first `num_seqs` lengths count. Returns a `DecodeReport`."""
    import numpy as np
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    kv_lens = _runtime_array("kv_lens", kv_lens)
    page_indices = _runtime_array("page_indices", page_indices)
    cu_q_lens = _runtime_array("cu_q_lens", cu_q_lens)
    num_seqs = _runtime_array("num_seqs", num_seqs)
    _, page_size, combined, head_dim = kv_pages.shape
    item = np.dtype(kv_pages.dtype).itemsize

    def step(q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs):
        return ragged_paged_attention(
            q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs,
            num_kv_pages_per_block=num_kv_pages_per_block, num_queries_per_block=num_queries_per_block, **kernel_options,
        )

    n = int(num_seqs.reshape(-1)[0])
    if not 0 <= n <= kv_lens.size:
        raise InputError(f"num_seqs = {n}: expected a whole number from 0 to the {kv_lens.size} entries of kv_lens")
    _check_lengths("kv_lens", kv_lens.reshape(-1)[:n], page_indices, page_size)
    return decode(
        step, q, kv_pages, kv_lens, page_indices, cu_q_lens, num_seqs, lengths=kv_lens.reshape(-1)[:n], page_size=page_size,
        kv_bytes_per_page=page_size * combined * head_dim * item, pages_per_block=num_kv_pages_per_block, chip=chip, set=set,
    )


def decode_sweep(make_step, points, *, path=None, force=False):
    """Runs `make_step(**point)` (which returns a `DecodeReport`, e.g. a `paged_attention_step`
    call; each point re-lowers the kernel, since page size and pages per block live in the
    lowering) for every point (dicts); returns rows (the point's keys, then the report's
    `row()`, or `error`: tpusim's refusal, or any other exception's type and message, so one
    failing point never loses the others), and writes them as CSV to `path` if given
    (completely or not at all).

    The CSV's first line is tpusim's mark, `# tpusim output: tpusim.jax.decode_sweep (tpusim
    VERSION)` (pandas: `read_csv(path, comment="#")`), then the header and the rows. `force`
    (default `False`): an existing `path` is replaced only when it carries that mark; any other
    file is refused with an `InputError` naming it, before the first point runs. `force=True`
    replaces it."""
    import csv
    import io

    if path is not None:
        path = _output_path(path, "path", "the CSV", "decode.csv")
        force = _force_arg(force)
        _tpusim._check_outputs("path", DECODE_SWEEP_COMMAND, [(path, None)], force)
    else:
        _force_arg(force)
    points = list(points)
    for i, p in enumerate(points):
        if not isinstance(p, dict) or not all(isinstance(k, str) for k in p):
            raise InputError(f"points[{i}] = {p!r}: each point is a dict of make_step's keyword arguments")
    rows = []
    for p in points:
        # A point that does not run is a row with its reason, as in `tpusim sweep` (the rows
        # done before it are kept): tpusim's refusal as it is, any other error with its type.
        try:
            r = make_step(**p)
            rows.append({**p, **r.row(), "error": ""})
        except InputError as e:
            rows.append({**p, "error": str(e)})
        except Exception as e:  # noqa: BLE001 - reported in the row, as the docstring says
            rows.append({**p, "error": f"{type(e).__name__}: {e}"})
    if path is not None:
        keys = []
        for r in rows:
            for k in r:
                if k not in keys:
                    keys.append(k)
        buf = io.StringIO()
        buf.write(_tpusim._mark_line(DECODE_SWEEP_COMMAND))
        w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow(r)
        _tpusim._write_output("path", path, buf.getvalue().encode())
    return rows
