"""Times the IR path end to end (issue 20, point 6): from an already-built JAX Splash function
(10 heads x 75,776 tokens x 128, full mask, every block 512, `make_splash_mha` and `import jax`
not counted), `tpusim.jax.simulate` - lower for TPU on the CPU, read the Mosaic IR, simulate on
v6e. The goal is under 2 s. Prints the median of 3 calls and, of the median call, the split:
lowering (`jax.export`), reading the IR into a description, and the Rust part (JSON in,
lowering, engine).

Run with the test environment's Python after installing the wheel (test.sh shows how):
`target/py-venv/bin/python crates/tpusim-py/bench_ir.py`.
"""

import json
import statistics
import time


def main():
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    import tpusim
    import tpusim.jax as tj

    heads, seq, dim, block = 10, 75776, 128, 512
    mask = sm.MultiHeadMask([sm.FullMask((seq, seq)) for _ in range(heads)])
    bs = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block)
    kernel = sk.make_splash_mha(mask, head_shards=1, q_seq_shards=1, block_sizes=bs)
    q = jax.ShapeDtypeStruct((heads, seq, dim), jnp.bfloat16)

    def fn(q, k, v):
        return kernel(q, k, v)

    totals = []
    for _ in range(3):
        t0 = time.perf_counter()
        rep = tj.simulate(fn, q, q, q, chip="v6e")
        totals.append(time.perf_counter() - t0)
    first = totals[0]
    # The split, once more by stage (JAX's caches warm by now, as in the later calls above).
    t0 = time.perf_counter()
    exported = tj.lower(fn, q, q, q, chip="v6e")
    t1 = time.perf_counter()
    descs, _ = tj._kernels(exported, (q, q, q))
    t2 = time.perf_counter()
    for d in descs:
        tpusim._tpusim.simulate_kernel_ir(json.dumps(d), chip="v6e", set=[])
    t3 = time.perf_counter()
    print(
        f"tpusim.jax.simulate, JAX Splash fwd {heads} x {seq} x {dim}, full mask, blocks {block} (v6e): "
        f"first call {first:.2f} s, median of 3 {statistics.median(totals):.2f} s "
        f"(by stage: lower {t1 - t0:.2f} s, read IR {t2 - t1:.2f} s, Rust incl. JSON {(t3 - t2) * 1e3:.0f} ms); "
        f"predicted {rep.latency_ms:.3f} ms; goal < 2 s"
    )


if __name__ == "__main__":
    main()
