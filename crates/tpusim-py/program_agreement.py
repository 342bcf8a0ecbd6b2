"""Prints the agreement tables of whole programs (tpusim.jax.simulate_program, crate
tpusim-program) for traces/measured/VALIDATION.md: the XLA ops' counts against XLA's own
`Lowered.cost_analysis()` of the same export, and JAX Splash behind a [B, S, H, D] wrapper
against `--scope call --input-layout bshd` without the host's dispatch. The programs are those of
`tests/test_program.py`, which holds the bands (counts 1%, latency 3%).

Run: target/py-venv/bin/python crates/tpusim-py/program_agreement.py  (after ./test.sh installed the wheel)
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tests"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tpusim.jax as tj  # noqa: E402
import test_program as T  # noqa: E402
from kernels import tutorial_matmul  # noqa: E402


def _pct(a, b):
    return f"{100 * (a / b - 1):+.2f}%" if b else "n/a"


def programs():
    yield "RMS norm, MLP (gelu), softmax of a transposed product, 256 x 512", T._block, T.BLOCK_ARGS, None
    mm = tutorial_matmul(256, 256, 256)
    bf = jax.ShapeDtypeStruct((512, 512), jnp.bfloat16)
    yield "x * 2, a Pallas matmul, tanh, sum (512^2)", lambda x, y: jnp.tanh(mm(x * 2, y).astype(jnp.float32)).sum(axis=0), (bf, bf), None
    f, args, mesh = T.collective_program()
    yield "shard_map on 2x4: dot, tanh, psum, all_gather", f, args, mesh


def main():
    print("| program | FLOPs tpusim / XLA | transcendentals tpusim / XLA | bytes unfused tpusim / XLA | the same without transposes | bytes fused |")
    print("|---|---|---|---|---|---|")
    for name, f, args, mesh in programs():
        r = tj.simulate_program(f, *args, mesh=mesh)
        ca = T._cost_analysis(f, args, mesh)
        nt = r.xla_bytes_unfused - T._transpose_bytes(tj.describe_program(f, *args, mesh=mesh))
        print(
            f"| {name} | {r.xla_flops:.6g} / {ca['flops']:.6g} ({_pct(r.xla_flops, ca['flops'])}) "
            f"| {r.xla_transcendentals:.6g} / {ca['transcendentals']:.6g} ({_pct(r.xla_transcendentals, ca['transcendentals'])}) "
            f"| {r.xla_bytes_unfused} / {ca['bytes accessed']:.0f} ({_pct(r.xla_bytes_unfused, ca['bytes accessed'])}) | {nt} ({_pct(nt, ca['bytes accessed'])}) | {r.xla_bytes_fused} |"
        )
    print()
    print("| JAX Splash fwd behind a [B, S, H, D] wrapper, v6e | program ms | `--scope call --input-layout bshd` ms (no dispatch) | error | wrapper fusions ms program / call |")
    print("|---|---|---|---|---|")
    h, s, d, b = T.BSHD
    for mask in ("full", "causal"):
        r, hand = T._bshd_runs(mask)
        call = hand.latency_ms - hand.host_ms
        fus = [e["seconds"] * 1e3 for e in r.by_kind("fusion")]
        wrap = [p["latency_ms"] for p in hand.phases if p["part"] == "wrapper"]
        print(
            f"| {mask}, 1 x {s} x {h} x {d}, blocks {b} | {r.latency_ms:.4f} | {call:.4f} | {_pct(r.latency_ms, call)} "
            f"| {' '.join(f'{x:.4f}' for x in fus)} / {' '.join(f'{x:.4f}' for x in wrap)} |"
        )


def wan_table():
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        r, lay = T._wan_runs(tmp)
    print()
    print("| small Wan-like block, v6e, 768 tokens | program ms | `tpusim layer` ms | error |")
    print("|---|---|---|---|")
    lay_mm = [o for o in lay["ops"] if o["category"] in ("projections", "feed-forward")]
    lay_att = [o for o in lay["ops"] if o["category"] == "attention"]
    for e, o in list(zip(r.by_kind("dot"), lay_mm)) + list(zip(r.by_kind("kernel"), lay_att)):
        print(f"| {o['name']} ({e['detail'].split(',')[0]}) | {e['seconds'] * 1e3:.4f} | {o['ms']:.4f} | {_pct(e['seconds'] * 1e3, o['ms'])} |")
    fus = r.by_kind("fusion")
    ours = sum(e["seconds"] for e in fus) * 1e3
    ew = [o for o in lay["ops"] if o["category"] == "elementwise"]
    theirs = sum(o["ms"] for o in ew)
    def flag(a, b):
        return " **over 5%**" if abs(a / b - 1) > 0.05 else ""

    print(f"| element-wise: {len(fus)} fusions / {len(ew)} layer ops | {ours:.4f} | {theirs:.4f} | {_pct(ours, theirs)}{flag(ours, theirs)} |")
    tr = sum(e["seconds"] for e in fus if e["ops"] == ["transpose"]) * 1e3
    tr_lay = sum(o["ms"] for o in ew if o["name"].endswith("transpose"))
    n_tr = sum(1 for e in fus if e["ops"] == ["transpose"])
    n_tr_lay = sum(1 for o in ew if o["name"].endswith("transpose"))
    print(f"| of which head transposes around Splash: {n_tr} fusions / {n_tr_lay} layer ops | {tr:.4f} | {tr_lay:.4f} | {_pct(tr, tr_lay)}{flag(tr, tr_lay)} |")
    st_lay = [o for o in ew if o["name"].endswith("statistics")]
    print(f"| of which norm statistics passes: - / {len(st_lay)} layer ops | - | {sum(o['ms'] for o in st_lay):.4f} | |")
    print(f"| block | {r.latency_ms:.4f} | {lay['latency_ms']:.4f} | {_pct(r.latency_ms, lay['latency_ms'])}{flag(r.latency_ms, lay['latency_ms'])} |")


if __name__ == "__main__":
    main()
    wan_table()
