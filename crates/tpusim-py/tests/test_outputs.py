"""The overwrite rule of the package's writers (issue 47): a file that exists is replaced only
when tpusim wrote it (its mark, `crates/tpusim-io/src/mark.rs`) or with `force=True`; every
path a call writes is checked before its first write, and a refusal leaves every file byte for
byte as it was and names the path, what is wrong and `force=True`."""

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import tpusim
import tpusim.jax as tj
from conftest import run_cli

PRECIOUS = b'{"my": "notes", "format": "tpusim-kernel-description"}\n'


def _copy():
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] * 2

    def f(x):
        return pl.pallas_call(
            kernel, grid=(4,), in_specs=[pl.BlockSpec((8, 128), lambda i: (i, 0))], out_specs=pl.BlockSpec((8, 128), lambda i: (i, 0)),
            out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        )(x)

    return f


X = np.ones((32, 128), np.float32)


def _gathered(calls=1, cast=False):
    """`calls` Pallas calls whose blocks come from a scalar-prefetch table longer than
    `tj.INLINE_TABLE_LIMIT`: a plain description writes it to a .npy side file."""

    def kernel(t_ref, x_ref, o_ref):
        o_ref[...] = x_ref[...] + 1

    def call(x, t):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=1,
                grid=(4,),
                in_specs=[pl.BlockSpec((8, 128), lambda i, t: (t[i].astype(jnp.int32) if cast else t[i], 0))],
                out_specs=pl.BlockSpec((8, 128), lambda i, t: (i, 0)),
            ),
            out_shape=jax.ShapeDtypeStruct((32, 128), jnp.float32),
        )(t, x)

    def f(x, t):
        for _ in range(calls):
            x = call(x, t)
        return x

    return f


TABLE = (np.arange(tj.INLINE_TABLE_LIMIT + 4, dtype=np.int32) % 4).astype(np.int32)


def _files(folder):
    return sorted(p.name for p in folder.iterdir())


def test_describe_refuses_a_file_it_did_not_write_before_lowering(tmp_path):
    mine = tmp_path / "precious.json"
    mine.write_bytes(PRECIOUS)

    def not_a_kernel(x):
        return x + 1  # lowering this raises "no Pallas kernel": the path is refused first

    for fn in (_copy(), not_a_kernel):
        with pytest.raises(tpusim.InputError, match=r"path = '.*precious\.json': exists and tpusim did not write it.*pass force=True to replace it"):
            tj.describe(fn, X, path=mine)
    assert mine.read_bytes() == PRECIOUS
    assert _files(tmp_path) == ["precious.json"], "nothing else written, no temporary file left"
    # A compressed file of someone else's is refused as well.
    packed = tmp_path / "precious.json.gz"
    packed.write_bytes(gzip.compress(PRECIOUS))
    before = packed.read_bytes()
    with pytest.raises(tpusim.InputError, match="tpusim did not write it"):
        tj.describe(_copy(), X, path=packed)
    assert packed.read_bytes() == before
    with pytest.raises(tpusim.InputError, match=r"force = 'yes': expected True or False"):
        tj.describe(_copy(), X, path=tmp_path / "new.json", force="yes")
    assert not (tmp_path / "new.json").exists()


def test_describe_refuses_a_side_file_beside_a_description_it_did_not_write(tmp_path):
    side = tmp_path / "k.prefetch0.npy"
    np.save(side, np.arange(7))
    before = side.read_bytes()
    # No description there: the side file is someone else's.
    with pytest.raises(tpusim.InputError, match=r"path = '.*k\.json': its side file .*k\.prefetch0\.npy exists and tpusim did not write it.*is not there; pass force=True"):
        tj.describe(_gathered(), X, TABLE, path=tmp_path / "k.json")
    assert side.read_bytes() == before and _files(tmp_path) == ["k.prefetch0.npy"]
    # A description of someone else's beside it: refused at the description, both left alone.
    (tmp_path / "k.json").write_bytes(PRECIOUS)
    with pytest.raises(tpusim.InputError, match=r"k\.json': exists and tpusim did not write it"):
        tj.describe(_gathered(), X, TABLE, path=tmp_path / "k.json")
    assert side.read_bytes() == before and (tmp_path / "k.json").read_bytes() == PRECIOUS


def test_describe_checks_every_path_before_the_first_write(tmp_path):
    # Two kernels: the second description goes to k.1.json, which is someone else's. Nothing is
    # written, not even the first description or its side file.
    (tmp_path / "k.1.json").write_bytes(PRECIOUS)
    with pytest.raises(tpusim.InputError, match=r"path = '.*k\.1\.json': exists and tpusim did not write it"):
        tj.describe(_gathered(calls=2), X, TABLE, path=tmp_path / "k.json")
    assert _files(tmp_path) == ["k.1.json"] and (tmp_path / "k.1.json").read_bytes() == PRECIOUS
    # Its side file, the same.
    (tmp_path / "k.1.json").unlink()
    np.save(tmp_path / "k.1.prefetch0.npy", np.arange(3))
    before = (tmp_path / "k.1.prefetch0.npy").read_bytes()
    with pytest.raises(tpusim.InputError, match=r"its side file .*k\.1\.prefetch0\.npy exists"):
        tj.describe(_gathered(calls=2), X, TABLE, path=tmp_path / "k.json")
    assert _files(tmp_path) == ["k.1.prefetch0.npy"] and (tmp_path / "k.1.prefetch0.npy").read_bytes() == before


def test_describe_replaces_its_own_files_and_anything_with_force(tmp_path):
    path = tmp_path / "k.json"
    [p] = tj.describe(_gathered(), X, TABLE, path=path)
    assert _files(tmp_path) == ["k.json", "k.prefetch0.npy"]
    # Its own description and the side file beside it are replaced without force.
    assert tj.describe(_gathered(), X, TABLE, path=path) == [p]
    first = path.read_bytes()
    # force=True replaces someone else's description and side file.
    path.write_bytes(PRECIOUS)
    np.save(tmp_path / "k.prefetch0.npy", np.arange(7))
    assert tj.describe(_gathered(), X, TABLE, path=path, force=True) == [p]
    assert path.read_bytes() == first
    assert np.array_equal(np.load(tmp_path / "k.prefetch0.npy"), TABLE)
    # The side file keeps the table's own type (an int32 prefetch table, not int64).
    assert np.load(tmp_path / "k.prefetch0.npy").dtype == TABLE.dtype == np.int32
    assert _files(tmp_path) == ["k.json", "k.prefetch0.npy"]
    run_cli("run", "--kernel-ir", path)
    mine = tmp_path / "precious.json"
    mine.write_bytes(PRECIOUS)
    tj.describe(_copy(), X, path=mine, force=True)
    assert json.loads(mine.read_bytes())["format"] == "tpusim-kernel-description"


def test_a_side_file_keeps_an_unsigned_table(tmp_path):
    # Mosaic's integer types are signless: a uint8 table (Mosaic `i8`) holding 200..249 is kept
    # as unsigned bytes, not refused as out of int8's range, and read back by the CLI.
    small = TABLE.astype(np.uint8)
    small[4:] = 200 + np.arange(small.size - 4) % 50
    [q] = tj.describe(_gathered(cast=True), X, small, path=tmp_path / "u.json")
    side = np.load(tmp_path / "u.prefetch0.npy")
    assert side.dtype == np.uint8 and np.array_equal(side, small)
    out, _ = run_cli("run", "--kernel-ir", q, "--format", "json")
    assert json.loads(out)["latency_ms"] == tj.simulate(_gathered(cast=True), X, small).latency_ms


class _Report:
    def __init__(self, n):
        self.n = n

    def row(self):
        return {"latency_ms": 0.5 * self.n}


def test_decode_sweep_marks_its_csv_and_refuses_a_file_it_did_not_write(tmp_path):
    ran = []

    def step(n):
        ran.append(n)
        return _Report(n)

    mine = tmp_path / "precious.csv"
    mine.write_bytes(b"n,latency_ms\n1,99\n")
    with pytest.raises(tpusim.InputError, match=r"path = '.*precious\.csv': exists and tpusim did not write it.*pass force=True to replace it"):
        tj.decode_sweep(step, [{"n": 1}, {"n": 2}], path=mine)
    assert ran == [], "refused before the first point runs"
    assert mine.read_bytes() == b"n,latency_ms\n1,99\n" and _files(tmp_path) == ["precious.csv"]
    # Another command's output is not this one's.
    theirs = tmp_path / "rows.csv"
    theirs.write_bytes(b"# tpusim output: from-trace (tpusim 0.1.0)\nid\nx\n")
    with pytest.raises(tpusim.InputError, match=r"holds the output of `tpusim from-trace`, not of `tpusim\.jax\.decode_sweep`; pass force=True"):
        tj.decode_sweep(step, [{"n": 1}], path=theirs)
    assert theirs.read_bytes() == b"# tpusim output: from-trace (tpusim 0.1.0)\nid\nx\n"
    with pytest.raises(tpusim.InputError, match=r"force = 1: expected True or False"):
        tj.decode_sweep(step, [{"n": 1}], path=tmp_path / "new.csv", force=1)
    # force=True replaces; the file starts with the mark; its own file is replaced without force.
    rows = tj.decode_sweep(step, [{"n": 1}, {"n": 2}], path=mine, force=True)
    lines = mine.read_text().splitlines()
    assert lines[0] == f"# tpusim output: tpusim.jax.decode_sweep (tpusim {tpusim.__version__})"
    assert lines[1:] == ["n,latency_ms,error", "1,0.5,", "2,1.0,"] and len(rows) == 2
    tj.decode_sweep(step, [{"n": 3}], path=mine)
    assert mine.read_text().splitlines()[1:] == ["n,latency_ms,error", "3,1.5,"]
