"""A microbenchmark kit that measures a TPU's mechanisms, so that tpusim can be calibrated to
your own chip: `python -m tpusim.microbench`.

The catalogue (`catalogue()`) is a list of small Pallas kernels, each isolating one mechanism of
the chip (a pipelined copy at block sizes and layouts, DMA issue, size and concurrency, paged
gathers from an SMEM page table at page sizes and head counts, empty grid steps and one-step
calls, matmuls at block sizes with 8- and 16-bit operands, weight-load-bound matmuls whose folds
fill part of the MXU, dependent chains on the VPU, EUP and XLU, head_dim 64 against 128). Each `Entry` has a name
(`microbench-<mechanism>-<params>`), its kernel family word (`microbench-<mechanism>`, the
`kernel` column of the rows it makes), the mechanism it isolates, the chip parameters it pins
(free text), and `build()`: the function and its arguments (`jax.ShapeDtypeStruct`s).

- `--simulate [--chip v6e]` prints tpusim's prediction of each (`tpusim.jax.simulate`).
- `--measure` (on a TPU VM, JAX for TPU at the release `tpusim.jax` reads) times each with JAX's
  profiler (the jitted module's device time, the median of many back-to-back calls), writes the
  rows in the measurement CSV format (`traces/measured/README.md`) and each kernel's description,
  which `tpusim calibrate` fits the chip model's mechanisms to.
- `--measure --dry-run` runs the same path on CPU with Pallas's interpret mode: the times mean
  nothing, and the rows say so (`timing` starts "interpret mode on CPU, not a measurement";
  their kernel word is `dry-run-microbench-...`, which no fit takes).

Judge entries (`role == "judge"`, listed with `--judges`) are whole kernels with public
measurements (vLLM's kv_cache_update) that check a calibrated model; they are never fitted.

Importing this module does not import JAX; `catalogue()` does.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

#: The prefix of every mechanism entry's name and kernel word: `tpusim calibrate` fits rows
#: whose `kernel` starts with it.
PREFIX = "microbench-"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One kernel of the catalogue.

    - `name`: `microbench-<mechanism>-<params>` (a judge: `<family>-<params>`), unique.
    - `kernel`: the family word its rows carry in the `kernel` column (`microbench-copy`, ...).
    - `mechanism`: what it isolates, in words.
    - `pins`: which chip-model parameters it pins (free text, for the docs).
    - `build(interpret=False)`: `(fn, args)`, the function (one `pl.pallas_call`) and its
      arguments: `jax.ShapeDtypeStruct`s, or NumPy arrays where the kernel reads the values
      (scalar-prefetch tables); `interpret=True` builds it for Pallas's interpret mode.
    - `carry`: the index of the argument the kernel updates in place (aliased to its output),
      or None; `--measure` donates it and passes each call's output to the next call.
    - `public`: the public measurement it reproduces, if any (free text).
    - `role`: `mechanism` (fitted by `tpusim calibrate`) or `judge` (checks a model, never fitted).
    - `id_stem`, `id_strip`: how `row_id` names its rows.
    """

    name: str
    kernel: str
    mechanism: str
    pins: str
    build: Callable[..., tuple[Callable[..., Any], list[Any]]]
    carry: int | None = None
    public: str | None = None
    role: str = "mechanism"
    id_stem: str = "MB"
    id_strip: str = PREFIX

    def row_id(self, chip: str) -> str:
        """The id of this entry's measurement row on `chip`: `id_stem`, the chip, and the name
        without `id_strip` (`MB-v6e-copy-t1` for `microbench-copy-t1`,
        `VLLM-KVUPD-v6e-pipelined-nspb8` for `kv-cache-update-vllm-pipelined-nspb8`)."""
        return f"{self.id_stem}-{chip}-{self.name[len(self.id_strip):]}"


def _entries():
    from functools import partial

    import jax.numpy as jnp

    from . import kernels as k

    out = []

    def add(name, kernel, mechanism, pins, builder, **kw):
        out.append(Entry(name, kernel, mechanism, pins, partial(builder, name=name.replace("-", "_")), **kw))

    step_dma = "grid-step overhead (fitted.grid_step_overhead_cycles), per-copy issue cost and latency (fitted.dma_issue_ns, fitted.dma_latency_ns)"
    for t in (1, 2, 4, 8, 16, 32, 64, 128):
        add(
            f"microbench-copy-t{t}", "microbench-copy",
            f"pipelined copy of bf16[2048, 4, 128] in ({t}, 4, 128) blocks ({2048 // t} steps of {2 * t} KiB in + out): a block below bf16's 16-row tile",
            f"{step_dma}; the HBM-to-VMEM rate (hbm.dma_bandwidth_gb_per_s) at large t",
            partial(k.copy, (2048, 4, 128), (t, 4, 128), jnp.bfloat16),
            public=f"tengyifei/playground pallas/index-copy.ipynb, v6e, t = {t}",
        )
    for label, dtype, rows in (("f32", jnp.float32, 8), ("bf16", jnp.bfloat16, 16)):
        for t in (1, 8, 64):
            add(
                f"microbench-copy-{label}tile-t{t}", "microbench-copy",
                f"pipelined copy of {label}[2048, {rows}, 128] in ({t}, {rows}, 128) blocks: whole ({rows}, 128) tiles, 4 KiB a row",
                f"{step_dma}, without the partial-tile layout of the public copy",
                partial(k.copy, (2048, rows, 128), (t, rows, 128), dtype),
            )
    add(
        "microbench-copy-f32-8192x1024-b512", "microbench-copy",
        "pipelined copy of f32[8192, 1024] (32 MiB) in (512, 1024) blocks: 16 steps of 2 MiB in + 2 MiB out",
        "the sustained HBM-to-VMEM rate (hbm.dma_bandwidth_gb_per_s, hbm.bandwidth_gb_per_s)",
        partial(k.copy, (8192, 1024), (512, 1024), jnp.float32),
    )

    add(
        "microbench-dma-hbm-hbm-rows2048", "microbench-dma",
        "one program: 2048 one-row (1 KiB) HBM-to-HBM copies started, then waited (one semaphore)",
        "per-copy issue cost (fitted.dma_issue_ns), copies in flight (fitted.dmas_in_flight), HBM-to-HBM copies",
        partial(k.dma_hbm_hbm_rows, 2048), carry=1,
        public="tengyifei/playground pallas/index-copy.ipynb, v6e, variant (c)",
    )
    add(
        "microbench-dma-via-vmem-rows2048", "microbench-dma",
        "one program: one 2 MiB HBM-to-VMEM copy and its wait, then 2048 one-row VMEM-to-HBM copies started, then waited",
        "per-copy issue cost (fitted.dma_issue_ns), copies in flight (fitted.dmas_in_flight), one large copy's latency and rate",
        partial(k.dma_via_vmem_rows, 2048), carry=1,
        public="tengyifei/playground pallas/index-copy.ipynb, v6e, variant (d)",
    )
    for label, tiles in (("4k", 1), ("64k", 16), ("1m", 256), ("4m", 1024)):
        add(
            f"microbench-dma-serial-{label}", "microbench-dma",
            f"one program: 8 HBM-to-VMEM copies of {label.upper()}iB ({tiles} f32 (8, 128) tiles), each waited before the next starts",
            "the DMA latency (fitted.dma_latency_ns) and issue cost at small sizes, the HBM-to-VMEM rate at large ones",
            partial(k.dma_serial, tiles),
        )
    for n in (1, 2, 4, 8, 16, 32, 64):
        add(
            f"microbench-dma-inflight-k{n}", "microbench-dma",
            f"one program: 256 one-tile (4 KiB) HBM-to-VMEM copies in groups of {n}: start {n}, wait them, next group",
            "copies in flight (fitted.dmas_in_flight) and the per-copy issue cost (fitted.dma_issue_ns) against the DMA latency",
            partial(k.dma_inflight, n),
        )
    for n in (1, 8, 64):
        add(
            f"microbench-dma-inflight-hbm-hbm-k{n}", "microbench-dma",
            f"one program: 256 one-tile (4 KiB) HBM-to-HBM copies in groups of {n}",
            "copies in flight and issue cost for HBM-to-HBM copies (their bytes cross HBM twice)",
            partial(k.dma_inflight, n, hbm_to_hbm=True),
        )
    add(
        "microbench-dma-grid-rows2048", "microbench-dma",
        "a grid of 2048 steps, each starting one one-row (1 KiB) HBM-to-HBM copy and waiting for it",
        "what a grid step adds to a copy it issues and waits (step overhead with manual DMAs)",
        partial(k.dma_grid_rows, 2048),
    )

    for g in (1, 64, 1024, 16384):
        add(
            f"microbench-step-empty-g{g}", "microbench-step",
            f"a grid of {g} empty steps (no input, one (8, 128) f32 output block written back once)",
            "the grid-step overhead (fitted.grid_step_overhead_cycles) and, at g = 1, the call's fixed cost",
            partial(k.empty_steps, g),
        )
    for shape in ((8, 128), (512, 1024)):
        kib = shape[0] * shape[1] * 4 // 1024
        add(
            f"microbench-step-one-copy-{shape[0]}x{shape[1]}", "microbench-step",
            f"one grid step copying one f32{list(shape)} block ({kib} KiB): launch, pipeline fill (the first copy) and drain (the write-back)",
            "the first copy's DMA latency (fitted.dma_latency_ns), the call's fixed cost, the write-back",
            partial(k.copy, shape, shape, jnp.float32),
        )

    for label, dtype in (("bf16", jnp.bfloat16), ("int8", jnp.int8)):
        for b in (128, 256, 512, 1024):
            add(
                f"microbench-matmul-{label}-b{b}", "microbench-matmul",
                f"the Pallas tutorial's blocked matmul, 2048 x 2048 x 2048 {label}, square {b} blocks ({(2048 // b) ** 3} steps)",
                "MXU cadence (mxu.passes_per_cycle) and result latency, the 8-bit rate (mxu.*_vs_bf16), fill and drain at small blocks",
                partial(k.matmul, 2048, b, dtype),
            )

    chain = dict(shape=(256, 1024), steps=8)
    add(
        "microbench-vpu-add-f32-r64", "microbench-vpu",
        "64 dependent f32 adds (y = y + x) over a resident (256, 1024) block, 8 steps (no copy after the first)",
        "VPU throughput (fitted.valu_vreg_ops_per_cycle)",
        partial(k.resident_chain, "add", 64, dtype=jnp.float32, **chain),
    )
    add(
        "microbench-vpu-add-bf16-r64", "microbench-vpu",
        "64 dependent bf16 adds over a resident (256, 1024) block, 8 steps",
        "VPU throughput on bf16 (packed) registers",
        partial(k.resident_chain, "add", 64, dtype=jnp.bfloat16, **chain),
    )
    add(
        "microbench-eup-exp-f32-r16", "microbench-eup",
        "16 dependent f32 exps (y = exp(y)) over a resident (256, 1024) block, 8 steps",
        "EUP throughput (fitted.eup_vregs_per_cycle)",
        partial(k.resident_chain, "exp", 16, dtype=jnp.float32, **chain),
    )
    add(
        "microbench-xlu-roll-f32-r32", "microbench-xlu",
        "32 dependent lane rotations (pltpu.roll by 1 along lanes) of a resident (256, 1024) f32 block, 8 steps",
        "XLU cost per register (fitted.xlu_cycles_per_vreg)",
        partial(k.resident_chain, "roll", 32, dtype=jnp.float32, **chain),
    )
    add(
        "microbench-xlu-lane-max-f32-r16", "microbench-xlu",
        "16 dependent lane reductions (y = y - max(y, lanes)) of a resident (256, 1024) f32 block, 8 steps",
        "XLU cross-lane reduction (fitted.xlu_cycles_per_vreg) with the VPU's combine and subtract",
        partial(k.resident_chain, "lane-max", 16, dtype=jnp.float32, **chain),
    )

    for m, kk, n in ((8, 128, 128), (8, 128, 256), (8, 256, 128), (8, 256, 256), (256, 256, 256)):
        add(
            f"microbench-mxu-fold-m{m}-k{kk}-n{n}", "microbench-mxu",
            f"64 bf16 matmuls of a resident ({m}, {kk}) block by 64 different ({kk}, {n}) weight blocks, summed in f32, 8 steps",
            ("streaming 256 rows through each fold against the 8-row entries' loading (mxu.rows, mxu.passes_per_cycle)" if m == 256 else
             "the MXU's weight-fold load time (mxu.rows, mxu.passes_per_cycle), and whether independent matmuls share the MXUs"
             + ("" if (kk, n) == (256, 256) else
                f"; a fold that fills {'a quarter' if (kk, n) == (128, 128) else 'half'} of the 256 x 256 array loading in part of the time")),
            partial(k.mxu_fold, m, kk, n),
        )

    for d in (64, 128):
        add(
            f"microbench-headdim-attn-d{d}", "microbench-headdim",
            f"q k^T then s v at head_dim {d} (2048 tokens, 512 blocks, bf16, no softmax)",
            "the MXU's use at a 64-wide contraction and output against 128 (mxu shape), per-step copies of narrow blocks",
            partial(k.attention_scores, d),
        )
        add(
            f"microbench-headdim-copy-d{d}", "microbench-headdim",
            f"pipelined copy of bf16[16384, {d}] in (1024, {d}) blocks: {d} of 128 lanes",
            "copies of blocks narrower than the 128 lanes (HBM layout, DMA rate per byte)",
            partial(k.copy, (16384, d), (1024, d), jnp.bfloat16),
        )

    for page, heads in ((16, 8), (64, 8), (256, 8), (64, 2), (64, 16)):
        add(
            f"microbench-dma-paged-p{page}-h{heads}", "microbench-dma",
            f"one program: a page table in SMEM, {2048 // page} copies of one {page}-token page of bf16[{page}, {heads}, 128] "
            f"({page * heads // 4} KiB) HBM to VMEM started in a scalar loop, then waited; 2048 tokens in all",
            ("what a page copy costs beyond its bytes (descriptor from an SMEM page table in a scalar loop), against the same "
             "2048 tokens in other page sizes: paged attention's KV fetch" if heads == 8 else
             f"a page whose {heads} heads {'fill 2 of' if heads < 16 else 'fill all'} bf16's 16 tile rows, against 8 heads at the same page size"),
            partial(k.dma_paged, page, heads),
        )

    for nspb in (8, 16, 32, 64, 128, 256):
        for pipelined in (False, True):
            v = "-pipelined" if pipelined else ""
            add(
                f"kv-cache-update-vllm{v}-nspb{nspb}", "kv-cache-update-vllm",
                f"vLLM's kv_cache_update{' (pipelined: a semaphore per slice)' if pipelined else ''}, {nspb} slices per step, the public fixture (2048 tokens in 536 slices)",
                "judge: per-copy cost, copies in flight and step overhead together (never fitted)",
                partial(k.kv_cache_update_vllm, nspb, pipelined), carry=2, role="judge", id_stem="VLLM-KVUPD", id_strip="kv-cache-update-vllm-",
                public=f"tengyifei/playground pallas/better-index-copy.ipynb, v6e, nspb = {nspb}{', pipelined' if pipelined else ''} (DMA tracing on)",
            )
    return out


_CATALOGUE: list[Entry] | None = None


def catalogue() -> list[Entry]:
    """Every entry, mechanisms first, then judges (imports JAX)."""
    global _CATALOGUE
    if _CATALOGUE is None:
        _CATALOGUE = _entries()
    return list(_CATALOGUE)


def select(only: str | None = None, judges: bool = False) -> list[Entry]:
    """The entries whose name matches the regular expression `only` (searched; all when None),
    mechanism entries only unless `judges`. Raises ValueError for a bad expression or one that
    selects nothing (naming the catalogue's names)."""
    try:
        rx = re.compile(only) if only else None
    except re.error as e:
        raise ValueError(f"--only {only!r}: not a regular expression: {e}") from None
    es = [e for e in catalogue() if (judges or e.role == "mechanism") and (rx is None or rx.search(e.name))]
    if not es:
        names = ", ".join(e.name for e in catalogue() if judges or e.role == "mechanism")
        raise ValueError(f"--only {only!r}: matches no entry{'' if judges else ' (judges need --judges)'}; the catalogue: {names}")
    return es
