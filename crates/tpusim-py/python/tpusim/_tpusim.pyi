"""Type stubs of tpusim's compiled module (crate tpusim-py). The docstrings of the compiled
functions and of `Report` are the reference; these stubs give their signatures and the report's
fields to editors and type checkers."""

from typing import Any, Literal, Mapping, Sequence

__version__: str

class InputError(ValueError):
    """Bad input: the message names the field, the value and what is allowed."""

class SimulationError(RuntimeError):
    """A failure that is not the input's fault (an output file that cannot be written)."""

Unit = Literal["mxu", "vpu", "eup", "xlu", "hbm", "step_control"]

class Report:
    """One simulated kernel call, whichever front end described it: a hand-modelled job
    (`tpusim.simulate`) or a kernel read from its IR (`tpusim.jax.simulate`; `job["kind"]` is
    `"described"`). Every key of `to_dict()` reads as an attribute; the attention-only fields
    are absent (an `AttributeError`) for matmuls and for kernels read from their IR."""

    # Read by the compiled getters.
    @property
    def latency_ms(self) -> float: ...
    @property
    def cycles(self) -> float: ...
    @property
    def flops(self) -> float: ...
    @property
    def transcendentals(self) -> float: ...
    @property
    def hbm_bytes(self) -> int: ...
    @property
    def mfu(self) -> float: ...
    @property
    def bottleneck(self) -> Unit: ...
    @property
    def co_bound(self) -> list[Unit]: ...
    @property
    def what_if_2x(self) -> list[dict[str, Any]] | None: ...
    @property
    def cost_estimate(self) -> dict[str, int]: ...
    @property
    def tiles(self) -> dict[str, int] | None: ...
    @property
    def band(self) -> dict[str, Any]: ...
    # Read from the report's JSON (`__getattr__`), every report.
    chip: str
    chip_model: dict[str, Any]
    kernel_name: str
    clock_ghz: float
    achieved_tflops: float
    peak_tflops: float
    # `flops` are executed: matmuls at (8, 128)-tile-padded dimensions, a head_dim below 128 as
    # 128 lanes; `hbm_bytes` what the copies move, whole tiles at an array's edge (the padding
    # rule, ARCHITECTURE.md). These two leave the padding out (for attention, `useful_flops` are
    # the model's: the mask's kept pairs, 4 x head_dim each forward, 10 x backward); `mfu` and
    # `achieved_tflops` count useful FLOPs.
    useful_flops: float
    useful_hbm_bytes: int
    # Of the MXU's busy time, the share in matmuls whose weight folds take longer to load than
    # their rows take to stream (absent without MXU work).
    mxu_fold_load_share: float
    arithmetic_intensity: float
    grid_steps: int
    # Grid steps that compute, over every kernel of the call: those whose body does MXU work (in a
    # kernel without MXU work, any unit work); not the steps that only initialize or finalize an
    # output. One definition for every kernel, hand-modelled or read from its IR, as `tpusim run`.
    steps_computed: int
    bound_rule: Literal["gain", "tied", "critical_path"] | None
    utilization: dict[str, float]
    busy_ms: dict[str, float]
    dma_stall_ms: float
    critical_path_ms: dict[str, float]
    job: dict[str, Any]
    grid: list[list[str | int]]  # [name, size] pairs
    padded: list[list[str | int]]  # [name, length, padded length]
    vmem_bytes: int
    vmem_limit_bytes: int
    vmem_buffers: list[list[str | int]]  # [buffer, bytes]
    kernel_ms: float
    outside_kernel_ms: float
    host_ms: float
    phases: list[dict[str, Any]]
    cores: list[dict[str, Any]]
    step_classes: list[dict[str, Any]]
    notes: list[str]
    # Present only where they apply.
    kernel: str  # a hand-modelled family (absent for a kernel read from its IR)
    pair_density: float  # attention
    exact_pair_density: float  # attention
    tile_density: float  # attention
    useful_fraction: float  # attention
    dense_latency_ms: float  # sparse attention
    tile_skip_efficiency: float  # sparse attention
    speedup_vs_dense: float  # sparse attention
    smem_bytes: int  # a kernel read from its IR, or a forward attention kernel's mask metadata
    declared_cost_estimate: dict[str, float]  # a kernel read from its IR that declares one (as the description holds it)
    assumptions: list[str]  # a kernel read from its IR
    measured: dict[str, Any]  # a job with a shipped measurement
    def to_dict(self) -> dict[str, Any]: ...
    def to_json(self) -> str: ...
    def __getattr__(self, name: str) -> Any: ...

def simulate(**kwargs: Any) -> Report: ...
def tune(
    top: int | None = None,
    allow_inexact: bool | None = None,
    allow_approximate: bool | None = None,
    refine: int | None = None,
    exhaustive: bool | None = None,
    **kwargs: Any,
) -> dict[str, Any]: ...
def chip(
    name_or_path: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    set: Mapping[str, Any] | str | Sequence[str] | None = None,
) -> dict[str, Any]: ...
def validate(rows: Any, chips: Sequence[str] | None = None) -> dict[str, Any]: ...
def sweep(points: Sequence[Mapping[str, Any]], **base: Any) -> list[dict[str, Any]]: ...
# `out`: the rows as CSV, marked as `tpusim from-trace --out` marks them. `force=False` (the
# default) replaces an existing `out` only when it carries that mark, checked before the trace is
# read; `force=True` replaces any file. The same keyword, default and rule on every writer of the
# package (`tpusim.jax.describe`, `tpusim.jax.decode_sweep`).
def measurements_from_trace(
    trace: str,
    kernel_pattern: str,
    id: str,
    out: str | None = None,
    device: str = "^/device:",
    line: str = "^XLA Ops$",
    force: bool = False,
    **kwargs: Any,
) -> list[dict[str, Any]]: ...
def trace_ops(trace: str, kernel_pattern: str, device: str = "^/device:", line: str = "^XLA Ops$") -> list[dict[str, Any]]: ...
def mask_text(mask: Any) -> str: ...
def tile_counts(
    mask: Any, block_q: int, block_kv: int, heads: int | None = None, q_len: int | None = None, kv_len: int | None = None
) -> list[dict[str, int]]: ...
def simulate_kernel_ir(description: str, chip: str = "v6e", set: Sequence[str] = (), folder: str = ".") -> Report: ...
def decode_kernel_ir(
    description: str,
    lengths: Sequence[int],
    page_size: int,
    kv_bytes_per_page: int,
    q_bytes: int,
    o_bytes: int,
    pages_per_block: int | None = None,
    chip: str = "v6e",
    set: Sequence[str] = (),
    folder: str = ".",
) -> tuple[str, str, str]: ...
def simulate_program_description(
    description: str, chip: str = "v6e", set: Sequence[str] = (), slice: str | None = None, folder: str = "."
) -> tuple[str, str]: ...
# The package's own writers' overwrite rule and atomic write (crate tpusim-io), for tpusim.jax and
# tpusim.microbench: not public API.
def _check_outputs(arg: str, command: str, targets: Sequence[tuple[str, str | None]], force: bool, flag: bool = False) -> None: ...
def _write_output(arg: str, path: str, data: bytes) -> None: ...
def _mark_line(command: str) -> str: ...
# The library kernel family table (crate tpusim-pallas), for tpusim.jax.describe: not public API.
def _kernel_family(kernel_name: str, files: Sequence[str]) -> str | None: ...
def _family_word_rule(family: str) -> str | None: ...
