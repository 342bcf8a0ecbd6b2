"""The decode study (issue 21, points 1-2): JAX's paged_attention and ragged paged attention
simulated from their Mosaic IR on v6e with given sequence lengths and page tables.

    target/py-venv/bin/python studies/decode.py      # writes plots/decode-*.csv and .svg

* decode-tiling: page size x pages per compute block, each point re-lowered (the tiling lives in
  the lowering), latency and HBM roofline fraction.
* decode-sensitivity: the two assumed DMA parameters of the chip model (fitted.dma_issue_ns,
  fitted.dmas_in_flight) swept around their values for one configuration.
* decode-rpa: a ragged paged attention decode batch at its explicit block sizes.
"""

import os
import subprocess
import sys

import numpy as np

import tpusim.jax as tj

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.environ.get("TPUSIM_BIN", os.path.join(ROOT, "target", "release", "tpusim"))
OUT = os.path.join(ROOT, "plots")


def plot(csv, x, y, series, out, title, logx=False):
    args = [BIN, "plot", "sweep", "--input", csv, "--x", x, "--y", y, "--out", out, "--title", title, "--force"]
    if series:
        args += ["--series", series]
    if logx:
        args += ["--logx"]
    subprocess.run(args, check=True)


def paged(page_size, pages_per_block, tokens=2048, batch=8, q_heads=32, kv_heads=8, d=128, set=None):
    import jax
    import jax.numpy as jnp

    pages_per_seq = tokens // page_size
    pages = batch * pages_per_seq
    q = jax.ShapeDtypeStruct((batch, q_heads, d), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((kv_heads, pages, page_size, d), jnp.bfloat16)
    table = np.arange(pages, dtype=np.int32).reshape(batch, pages_per_seq)
    lengths = np.full(batch, tokens, np.int32)
    lengths[::2] = tokens * 3 // 4 + 5  # ragged: every other sequence part full
    return tj.paged_attention_step(q, kv, kv, lengths, table, pages_per_compute_block=pages_per_block, set=set)


def main():
    pts = [{"page_size": ps, "pages_per_block": ppb} for ps in (16, 32, 64, 128) for ppb in (1, 2, 4, 8) if ps * ppb <= 512]
    rows = tj.decode_sweep(paged, pts, path=os.path.join(OUT, "decode-tiling.csv"))
    for r in rows:
        print({k: r[k] for k in ("page_size", "pages_per_block", "latency_ms", "roofline_fraction", "bound", "error") if k in r})
    csv = os.path.join(OUT, "decode-tiling.csv")
    plot(csv, "page_size", "latency_ms", "pages_per_block", os.path.join(OUT, "decode-tiling-latency.svg"), "paged_attention decode step on v6e (8 x 2048 tokens, 32/8 heads): latency", logx=True)
    plot(csv, "page_size", "roofline_fraction", "pages_per_block", os.path.join(OUT, "decode-tiling-roofline.svg"), "paged_attention decode step on v6e: HBM roofline fraction", logx=True)

    sens = []
    for issue in (5, 10, 20, 40, 80):
        for f in (16, 32, 64, 128, 256):
            r = paged(32, 4, set={"fitted.dma_issue_ns": issue, "fitted.dmas_in_flight": f})
            sens.append({"dma_issue_ns": issue, "dmas_in_flight": f, **r.row()})
    import csv as _csv

    path = os.path.join(OUT, "decode-sensitivity.csv")
    with open(path, "w", newline="") as fh:
        w = _csv.DictWriter(fh, fieldnames=list(sens[0]))
        w.writeheader()
        w.writerows(sens)
    plot(path, "dmas_in_flight", "roofline_fraction", "dma_issue_ns", os.path.join(OUT, "decode-sensitivity.svg"), "paged_attention (page 32, 4 pages per block) on v6e: roofline fraction vs the assumed DMA parameters", logx=True)

    import jax
    import jax.numpy as jnp

    seqs, page_size, ppseq = 16, 64, 32
    kv_lens = np.array([(i * 397) % 2000 + 48 for i in range(seqs)], np.int32)
    q = jax.ShapeDtypeStruct((seqs, 32, 128), jnp.bfloat16)
    kv = jax.ShapeDtypeStruct((seqs * ppseq, page_size, 16, 128), jnp.bfloat16)
    table = np.arange(seqs * ppseq, dtype=np.int32).reshape(seqs, ppseq)
    cu = np.arange(seqs + 1, dtype=np.int32)
    r = tj.ragged_paged_attention_step(q, kv, kv_lens, table, cu, np.array([seqs], np.int32), num_kv_pages_per_block=8, num_queries_per_block=16)
    with open(os.path.join(OUT, "decode-rpa.txt"), "w") as fh:
        fh.write(str(r))
    print(r)


if __name__ == "__main__":
    sys.exit(main())
