"""The kernels whose predictions must not depend on the JAX release they are lowered under (a test
helper, not tests): the README's RMSNorm, the Pallas tutorial's matmul, and JAX's library
kernels whose source is the same in every tested release apart from annotations (flash
attention, Splash forward and backward, paged and ragged paged attention, megablox gmm).

    python release_kernels.py FOLDER

lowers each under the installed JAX, writes its descriptions to FOLDER (`I.K.json`: kernel K of case
I, in the order of `CASES`) and prints
one JSON object: {"jax": the release, "reports": {NAME: [each kernel's report, as `to_dict()`]}}.
`tests/test_jax_releases.py` runs it under another release's environment and compares;
`jax-releases.sh` prints the latencies of every release side by side."""

import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import tpusim.jax as tj  # noqa: E402
from kernels import bf16, flash, rms_norm, splash, splash_bwd, tutorial_matmul  # noqa: E402

H, S, D = 4, 2048, 128


def _paged():
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    q = bf16(8, 32, 128)
    kv = bf16(8, 8 * 64, 32, 128)
    lengths = np.array([2048, 1500, 2048, 37, 900, 2048, 1, 1024], np.int32)
    pages = np.arange(8 * 64, dtype=np.int32).reshape(8, 64)
    return (lambda q, k, v, n, p: paged_attention(q, k, v, n, p, pages_per_compute_block=4)), (q, kv, kv, lengths, pages)


def _ragged():
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    q = bf16(64, 32, 128)
    kv = bf16(256, 16, 16, 128)
    kv_lens = np.array([100, 300, 5, 0], np.int32)
    pages = np.arange(256, dtype=np.int32).reshape(4, 64)
    cu_q_lens = np.array([0, 16, 48, 64, 64], np.int32)
    num_seqs = np.array([3], np.int32)

    def f(*a):
        return ragged_paged_attention(*a, num_kv_pages_per_block=8, num_queries_per_block=16)

    return f, (q, kv, kv_lens, pages, cu_q_lens, num_seqs)


def _gmm():
    from jax.experimental.pallas.ops.tpu.megablox import gmm

    lhs, rhs = bf16(512, 256), bf16(4, 256, 256)
    group_sizes = np.array([128, 64, 192, 128], np.int32)
    return (lambda lhs, rhs, gs: gmm(lhs, rhs, gs, tiling=(128, 128, 128))), (lhs, rhs, group_sizes)


#: name -> (function, arguments): each call's kernels are simulated on v6e.
CASES = {
    "README rms_norm": lambda: (rms_norm(256), (bf16(8192, 2048), bf16(1, 2048))),
    "tutorial matmul": lambda: (tutorial_matmul(512, 512, 512), (bf16(2048, 2048), bf16(2048, 2048))),
    "flash attention causal": lambda: (flash(True, 512, 1024, 512), (bf16(1, H, S, D),) * 3),
    "Splash fwd causal": lambda: (splash("causal", H, S, 512), (bf16(H, S, D),) * 3),
    "Splash fwd numpy-causal": lambda: (splash("numpy-causal", H, S, 512), (bf16(H, S, D),) * 3),
    "Splash bwd causal": lambda: (splash_bwd("causal", H, S, 512), (bf16(H, S, D),) * 3),
    "Splash bwd fused causal": lambda: (splash_bwd("causal", H, S, 1024, fused=True, block_kv_compute=512), (bf16(H, S, D),) * 3),
    "paged attention": _paged,
    "ragged paged attention": _ragged,
    "megablox gmm": _gmm,
}


def reports(folder=None):
    """{name: [report dict per kernel]} under the installed JAX; with `folder`, each kernel's
    description is written there as `I.K.json` (kernel K of the I-th case)."""
    out = {}
    for i, (name, case) in enumerate(CASES.items()):
        fn, args = case()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tj.JaxReleaseWarning)
            descs, _ = tj.describe_all(fn, *args, chip="v6e")
        out[name] = [tj._tpusim.simulate_kernel_ir(json.dumps(d), chip="v6e", set=[]).to_dict() for d in descs]
        if folder is not None:
            for k, d in enumerate(descs):
                with open(os.path.join(folder, f"{i}.{k}.json"), "w") as f:
                    json.dump(d, f)
    return out


if __name__ == "__main__":
    folder = sys.argv[1] if len(sys.argv) > 1 else None
    print(json.dumps({"jax": jax.__version__, "reports": reports(folder)}))
