"""Prints the agreement table of the IR path against the hand-written lowerings (markdown), for
traces/measured/VALIDATION.md: for each configuration, the kernel lowered with JAX for TPU and
simulated from its Mosaic IR (tpusim.jax) beside the hand model of the same kernel family.
Counts (grid steps, steps computed, FLOPs, EUP ops, HBM bytes) must be equal, latency within 3%
(`tests/test_agreement.py` holds the table to that).

Run: target/py-venv/bin/python crates/tpusim-py/agreement.py  (after ./test.sh installed the wheel)
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tests"))

import tpusim  # noqa: E402
import tpusim.jax as tj  # noqa: E402
from kernels import bf16, splash, tutorial_matmul  # noqa: E402

FIELDS = ("grid_steps", "steps_computed", "flops", "transcendentals", "hbm_bytes")

#: Latency band of the agreement (relative).
BAND = 0.03

#: (name, chip, ir thunk, hand kwargs) of every row.
H, S, D = 4, 2048, 128


def configs():
    for mask in ("full", "causal", "local:512,0", "chunked:1024", "numpy-causal"):
        for b in (512, 1024):
            hand_mask = "causal" if mask == "numpy-causal" else mask
            extra = {"mask_source": "loaded"} if mask == "numpy-causal" else {}
            yield (
                f"JAX Splash fwd {mask}, {H} x {S} x {D}, blocks {b}",
                "v6e",
                lambda mask=mask, b=b: tj.simulate(splash(mask, H, S, b), bf16(H, S, D), bf16(H, S, D), bf16(H, S, D), chip="v6e")[0],
                dict(kernel="splash", heads=H, seq_len=S, head_dim=D, mask=hand_mask, block_q=b, block_kv=b, block_kv_compute=b, **extra),
            )
    for chip in ("v6e", "v5e"):
        for b in (256, 512):
            n = 2048
            yield (
                f"Pallas tutorial matmul {n}^3, blocks {b}",
                chip,
                lambda b=b, chip=chip, n=n: tj.simulate(tutorial_matmul(b, b, b), bf16(n, n), bf16(n, n), chip=chip)[0],
                dict(kernel="pallas-matmul", m=n, n=n, k=n, block_m=b, block_n=b, block_k=b, chip=chip),
            )


def hand_value(hand, f):
    if f == "steps_computed":
        return hand.tiles["visited"] if hand.tiles else hand.grid_steps
    return getattr(hand, f)


def rows():
    """(name, chip, ir report or None, hand report or the refusal's message)."""
    for name, chip, ir, kw in configs():
        try:
            r = ir()
        except tpusim.InputError as e:
            yield name, chip, None, str(e)
            continue
        yield name, chip, r, tpusim.simulate(**kw)


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
        flag = "" if abs(err) <= BAND else " **over 3%**"
        print(f"| {name} | {chip} | " + " | ".join(cells) + f" | {ir.latency_ms:.4f} / {hand.latency_ms:.4f} | {100 * err:+.1f}%{flag} |")


if __name__ == "__main__":
    main()
