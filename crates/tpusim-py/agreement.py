"""Prints the agreement table of the IR path against the hand-written lowerings (markdown), for
traces/measured/VALIDATION.md: for each configuration, the kernel lowered with JAX for TPU and
simulated from its Mosaic IR (tpusim.jax) beside the hand model of the same kernel family.
Both build their step bodies from op sequences through one body builder and declare their
`pallas_call` alike (one declaration, Pallas's copy rule over it), so the distinct step bodies
that ran (each with its op count and signature, and its step count), the pipeline around them
(the VMEM buffers in order: role, shape, dtype, buffer count, bytes; every grid step's copies;
the steps that compute), the counts (grid steps, FLOPs, EUP ops, HBM bytes) and the latency
must be equal exactly (`tests/test_agreement.py` holds the table to that).

Run: target/py-venv/bin/python crates/tpusim-py/agreement.py  (after ./test.sh installed the wheel)
"""

import functools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "tests"))

import tpusim  # noqa: E402
import tpusim.jax as tj  # noqa: E402
from kernels import bf16, flash, splash, splash_bwd, tutorial_matmul  # noqa: E402

FIELDS = ("grid_steps", "flops", "transcendentals", "hbm_bytes")


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
    # JAX Splash backward: the dq and dkv kernels of the unfused path and the fused dkv kernel,
    # each against the hand model's phase of the same kernel.
    for mask in ("full", "causal", "local:512,0", "chunked:1024"):
        for b in (512, 1024):
            for fused in (False, True):
                bw = dict(block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=b)
                if fused:
                    bw["use_fused_bwd_kernel"] = True
                else:
                    bw.update(block_q_dq=b, block_kv_dq=b)
                hand = dict(kernel="splash", direction="bwd", heads=H, seq_len=S, head_dim=D, mask=mask, block_q=b, block_kv=b, block_kv_compute=b, **bw)
                for kern, part in ((("dkv", "fused_backward"),) if fused else (("dq", "dq"), ("dkv", "dkv"))):
                    label = "fused dq/dk/dv" if fused else kern
                    yield (
                        f"JAX Splash bwd {label} {mask}, {H} x {S} x {D}, blocks {b}",
                        "v6e",
                        lambda mask=mask, b=b, fused=fused, kern=kern: _bwd_kernel(mask, b, fused, kern),
                        dict(hand, _phase=part),
                    )
    # The fused kernel with sub-tiled kv blocks (its f32 dq accumulator).
    for mask in ("full", "causal"):
        b, c = 1024, 512
        yield (
            f"JAX Splash bwd fused dq/dk/dv {mask}, {H} x {S} x {D}, blocks {b}, block_kv_dkv_compute {c}",
            "v6e",
            lambda mask=mask, b=b, c=c: _bwd_kernel(mask, b, True, "dkv", c),
            dict(kernel="splash", direction="bwd", heads=H, seq_len=S, head_dim=D, mask=mask, block_q=b, block_kv=b, block_kv_compute=b,
                 block_q_dkv=b, block_kv_dkv=b, block_kv_dkv_compute=c, use_fused_bwd_kernel=True, _phase="fused_backward"),
        )
    # JAX's older flash attention forward (block_q, block_k_major, block_k).
    for causal in (False, True):
        for bq, bk, bkc in ((512, 512, 512), (1024, 1024, 1024), (512, 1024, 512)):
            yield (
                f"JAX flash attention fwd {'causal' if causal else 'full'}, 1 x {H} x {S} x {D}, blocks {bq} / {bk} / {bkc}",
                "v6e",
                lambda causal=causal, bq=bq, bk=bk, bkc=bkc: tj.simulate(flash(causal, bq, bk, bkc), bf16(1, H, S, D), bf16(1, H, S, D), bf16(1, H, S, D), chip="v6e")[0],
                dict(kernel="flash-attention", batch=1, heads=H, seq_len=S, head_dim=D, mask="causal" if causal else "full", block_q=bq, block_kv=bk, block_kv_compute=bkc),
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


@functools.lru_cache(maxsize=None)
def _bwd_call(mask, b, fused, c):
    return tj.simulate(splash_bwd(mask, H, S, b, fused, c), bf16(H, S, D), bf16(H, S, D), bf16(H, S, D), chip="v6e")


def _bwd_kernel(mask, b, fused, kern, c=None):
    """The report of one backward kernel (`dq` or `dkv`) of a lowered `jax.grad` of Splash."""
    tag = "_dq_" if kern == "dq" else "_dkv_"
    return next(k for k in _bwd_call(mask, b, fused, c) if tag in k.to_dict()["kernel_name"] + "_")


class Phase:
    """One kernel phase of a hand-model report, with a report's count fields, bodies and
    pipeline."""

    def __init__(self, p, pipeline):
        self.grid_steps = p["grid_steps"]
        self.tiles = p.get("tiles")
        self.flops = p["flops"]
        self.transcendentals = p["transcendentals"]
        self.hbm_bytes = p["hbm_bytes"]
        self.latency_ms = p["latency_ms"]
        self.step_classes = p.get("step_classes", [])
        self.pipelines = [pipeline]


def bodies(report):
    """The distinct step bodies that ran, as sorted (signature, ops, steps) with the steps of
    equal bodies summed: what both front ends must build alike."""
    out = {}
    for c in report.step_classes:
        key = (c["signature"], c["ops"])
        out[key] = out.get(key, 0) + c["steps"]
    return sorted((k[0], k[1], n) for k, n in out.items())


def hand(kw):
    """The hand model's report for a row's keywords: the whole call, or (`_phase`) the phase of
    the kernel the row compares (the backward's dq, dkv or fused kernel)."""
    kw = dict(kw)
    part = kw.pop("_phase", None)
    r = tpusim.simulate(**kw)
    if part is None:
        return r
    phase = next(p for p in r.phases if p["kernel"] and p["part"] == part)
    return Phase(phase, next(p for p in r.pipelines if p["part"] == part))


def hand_value(hand, f):
    return getattr(hand, f)


def pipeline(report):
    """The main kernel's pipeline as both front ends must declare it: steps computed, the VMEM
    buffers in order (role, shape, dtype, buffer count, bytes; not their names) and every grid
    step's copies (ref, direction, bytes, DMAs, shape, buffers), run-length coded in step
    order."""
    p = report.pipelines[0]
    sets = [tuple((c["r"], c["dir"], c["bytes"], c["dmas"], tuple(c["shape"]), c["buffers"]) for c in s["copies"]) for s in p["copy_sets"]]
    steps = []
    for n, i in p["steps"]:
        if steps and steps[-1][1] == sets[i]:
            steps[-1] = (steps[-1][0] + n, sets[i])
        else:
            steps.append((n, sets[i]))
    vmem = [(b["role"], tuple(b["shape"]), b["dtype"], b["buffers"], b["bytes"]) for b in p["vmem"]]
    return {"steps_computed": p["steps_computed"], "vmem": vmem, "copies": steps}


def pipeline_diff(a, b):
    """The first difference between two pipelines ([`pipeline`]), as text, or None."""
    for k in ("steps_computed", "vmem", "copies"):
        if a[k] != b[k]:
            if k == "steps_computed":
                return f"steps_computed {a[k]} / {b[k]}"
            for i, (x, y) in enumerate(zip(a[k], b[k])):
                if x != y:
                    return f"{k}[{i}]: {x} / {y}"
            return f"{k}: {len(a[k])} / {len(b[k])} entries"
    return None


def rows():
    """(name, chip, ir report or None, hand report or the refusal's message)."""
    for name, chip, ir, kw in configs():
        try:
            r = ir()
        except tpusim.InputError as e:
            yield name, chip, None, str(e)
            continue
        yield name, chip, r, hand(kw)


def main():
    print("| kernel | chip | " + " | ".join(f"{f} IR / hand" for f in FIELDS) + " | steps computed IR / hand (with VMEM and copies) | step bodies (ops x steps) | latency ms IR / hand |")
    print("|---|---|" + "---|" * (len(FIELDS) + 3))
    for name, chip, ir, hand in rows():
        if ir is None:
            print(f"| {name} | {chip} | refused: {hand.split(': ', 1)[-1][:90]} |" + " |" * (len(FIELDS) + 2))
            continue
        cells = []
        for f in FIELDS:
            a, b = getattr(ir, f), hand_value(hand, f)
            mark = "=" if a == b else "**differ**"
            cells.append(f"{a:.4g} / {b:.4g} {mark}")
        b_ir, b_hand = bodies(ir), bodies(hand)
        same = "=" if b_ir == b_hand else "**differ**"
        shown = ", ".join(f"{ops} x {n}" for _, ops, n in b_ir)
        p_ir, p_hand = pipeline(ir), pipeline(hand)
        cells.append(f"{p_ir['steps_computed']} / {p_hand['steps_computed']} " + ("=" if p_ir == p_hand else "**differ**"))
        lat = "=" if ir.latency_ms == hand.latency_ms else "**differ**"
        print(f"| {name} | {chip} | " + " | ".join(cells) + f" | {shown} {same} | {ir.latency_ms:.4f} / {hand.latency_ms:.4f} {lat} |")


if __name__ == "__main__":
    main()
