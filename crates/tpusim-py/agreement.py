"""Prints the agreement table of the IR path against the hand-written lowerings (markdown), for
traces/measured/VALIDATION.md: for each configuration, the kernel lowered with JAX for TPU and
simulated from its Mosaic IR (tpusim.jax) beside the hand model of the same kernel family.

Run: target/py-venv/bin/python crates/tpusim-py/agreement.py  (after ./test.sh installed the wheel)
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tests"))

import tpusim  # noqa: E402
import tpusim.jax as tj  # noqa: E402
from kernels import bf16, splash, tutorial_matmul  # noqa: E402

FIELDS = ("grid_steps", "steps_computed", "flops", "transcendentals", "hbm_bytes")


def rows():
    h, s, d = 4, 2048, 128
    for mask in ("full", "causal", "local:512,0", "chunked:1024"):
        for b in (512, 1024):
            try:
                tj.simulate(splash(mask, h, s, b), bf16(h, s, d), bf16(h, s, d), bf16(h, s, d), chip="v6e")
            except tpusim.InputError as e:
                yield f"JAX Splash fwd {mask}, {h} x {s} x {d}, blocks {b}", "v6e", None, str(e)
                continue
            ir = tj.simulate(splash(mask, h, s, b), bf16(h, s, d), bf16(h, s, d), bf16(h, s, d), chip="v6e")[0]
            hand = tpusim.simulate(kernel="splash", heads=h, seq_len=s, head_dim=d, mask=mask, block_q=b, block_kv=b, block_kv_compute=b)
            yield f"JAX Splash fwd {mask}, {h} x {s} x {d}, blocks {b}", "v6e", ir, hand
    for chip in ("v6e", "v5e"):
        for b in (256, 512):
            n = 2048
            ir = tj.simulate(tutorial_matmul(b, b, b), bf16(n, n), bf16(n, n), chip=chip)[0]
            hand = tpusim.simulate(kernel="pallas-matmul", m=n, n=n, k=n, block_m=b, block_n=b, block_k=b, chip=chip)
            yield f"Pallas tutorial matmul {n}^3, blocks {b}", chip, ir, hand


def hand_value(hand, f):
    if f == "steps_computed":
        return hand.tiles["visited"] if hand.tiles else hand.grid_steps
    return getattr(hand, f)


def main():
    print("| kernel | chip | " + " | ".join(f"{f} IR / hand" for f in FIELDS) + " | latency ms IR / hand | error |")
    print("|---|---|" + "---|" * (len(FIELDS) + 2))
    for name, chip, ir, hand in rows():
        if ir is None:
            print(f"| {name} | {chip} | refused: {hand.split(': ', 1)[-1][:90]} |" + " |" * (len(FIELDS) + 1))
            continue
        cells = []
        for f in FIELDS:
            a, b = getattr(ir, f), hand_value(hand, f)
            mark = "=" if a == b else "**differ**"
            cells.append(f"{a:.4g} / {b:.4g} {mark}")
        err = ir.latency_ms / hand.latency_ms - 1
        print(f"| {name} | {chip} | " + " | ".join(cells) + f" | {ir.latency_ms:.4f} / {hand.latency_ms:.4f} | {100 * err:+.1f}% |")


if __name__ == "__main__":
    main()
