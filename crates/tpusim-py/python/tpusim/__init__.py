"""tpusim: a cycle-approximate simulator of Google TPU chips for attention kernels.

`simulate(...)` runs one kernel call, `tune(...)` ranks block sizes and options, `sweep(points,
...)` runs many, `chip(name)` shows a chip model, `validate(rows)` compares with measurements and
`measurements_from_trace(...)` reads them from an XProf / Perfetto trace. Masks may be JAX Splash
mask objects or NumPy arrays; block sizes a Splash `BlockSizes`.

`tpusim.jax` (needs JAX 0.9.0 to 0.10.2: the package's `jax` extra) simulates your own Pallas kernels from their TPU
lowering: `tpusim.jax.simulate(fn, *args, chip="v6e")`. It is imported on demand, so that
`import tpusim` never imports JAX.
"""

from ._tpusim import (  # noqa: F401  (the compiled module, crate tpusim-py)
    InputError,
    Report,
    SimulationError,
    __version__,
    chip,
    mask_text,
    measurements_from_trace,
    simulate,
    sweep,
    tile_counts,
    trace_ops,
    tune,
    validate,
)

__all__ = [
    "InputError",
    "Report",
    "SimulationError",
    "__version__",
    "chip",
    "mask_text",
    "measurements_from_trace",
    "simulate",
    "sweep",
    "tile_counts",
    "trace_ops",
    "tune",
    "validate",
]
