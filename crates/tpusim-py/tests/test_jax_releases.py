"""tpusim.jax under every tested JAX release: the installed release is recorded, an older one is
refused and a newer one tried with a warning, an op or attribute the reader does not know is an
error naming it, and the kernels of `release_kernels.py` predict bit-equal under this release and
another one (the newest's environment, or from the newest the oldest's: `jax-releases.sh` makes
them under target/jax-envs and names the other in $TPUSIM_JAX_REFERENCE)."""

import glob
import json
import os
import re
import subprocess
import sys
import tomllib
import warnings

import jax
import pytest

import tpusim
import tpusim.jax as tj
from conftest import ROOT, run_cli
from kernels import bf16, rms_norm, tutorial_matmul

HERE = os.path.dirname(os.path.abspath(__file__))


def test_the_tested_releases_are_ordered_and_the_installed_one_is_among_them():
    keys = [tj._release_key(v) for v in tj.TESTED_JAX]
    assert keys == sorted(keys) and len(set(keys)) == len(keys), tj.TESTED_JAX
    assert tj._release_key("0.9.0") < tj._release_key("0.9.0.1") < tj._release_key("0.9.1")
    assert tj._release_key("0.10.3.dev20260301") > tj._release_key(tj.TESTED_JAX[-1])
    assert tj._release_key("0.10.0rc1") == (0, 10, 0)
    # This environment's JAX is one of them (jax-releases.sh and .ci/run install only those).
    assert jax.__version__ in tj.TESTED_JAX, jax.__version__


def test_a_description_records_the_release_it_was_lowered_under(tmp_path):
    paths = tj.describe(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512), path=tmp_path / "mm.json")
    d = json.loads(open(paths[0]).read())
    assert d["producer"]["jax"] == jax.__version__
    assert d["producer"]["tool"] == "tpusim.jax" and d["producer"]["device_kind"] == "TPU v6 lite"
    assert isinstance(d["producer"]["mosaic_version"], int) and d["producer"]["mosaic_version"] >= 1
    rep = json.loads(run_cli("run", "--kernel-ir", paths[0], "--format", "json")[0])
    assert rep["grid_steps"] == 8


def test_an_older_release_is_refused_naming_the_range_and_the_commands(monkeypatch):
    monkeypatch.setattr(jax, "__version__", "0.8.2")
    with pytest.raises(tpusim.InputError) as e:
        tj.simulate(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512))
    msg = str(e.value)
    assert "JAX 0.8.2 is installed" in msg and f"{tj.TESTED_JAX[0]} to {tj.TESTED_JAX[-1]}" in msg, msg
    assert f"pip install 'jax[cpu]=={tj.TESTED_JAX[-1]}'" in msg and "pip install './crates/tpusim-py[jax]'" in msg, msg


def test_a_newer_release_is_tried_with_a_warning_naming_the_tested_range(monkeypatch, tmp_path):
    monkeypatch.setattr(jax, "__version__", "0.11.0")
    monkeypatch.setattr(tj, "_warned", set())
    with pytest.warns(tj.JaxReleaseWarning) as record:
        paths = tj.describe(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512), path=tmp_path / "mm.json")
    msgs = [str(w.message) for w in record if issubclass(w.category, tj.JaxReleaseWarning)]
    assert len(msgs) == 1, msgs
    assert "JAX 0.11.0 is newer than the releases tpusim.jax is tested with" in msgs[0], msgs[0]
    assert f"{tj.TESTED_JAX[0]} to {tj.TESTED_JAX[-1]}" in msgs[0] and "tried" in msgs[0], msgs[0]
    # It is tried: the description is written, recording the release it was lowered under.
    assert json.loads(open(paths[0]).read())["producer"]["jax"] == "0.11.0"
    # Once per process: a second call does not warn again.
    with warnings.catch_warnings():
        warnings.simplefilter("error", tj.JaxReleaseWarning)
        r = tj.simulate(tutorial_matmul(256, 256, 256), bf16(512, 512), bf16(512, 512))[0]
    assert r.grid_steps == 8


def test_missing_jax_names_commands_that_work(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` raises ImportError
    with pytest.raises(tpusim.InputError) as e:
        tj._jax()
    msg = str(e.value)
    assert f"pip install 'jax[cpu]=={tj.TESTED_JAX[-1]}'" in msg, msg
    assert "pip install './crates/tpusim-py[jax]'" in msg, msg
    assert "'tpusim[jax]'" not in msg, msg  # not a name on PyPI
    # The clone's path holds the package, and its `jax` extra allows exactly the tested range.
    meta = tomllib.loads((ROOT / "crates" / "tpusim-py" / "pyproject.toml").read_text())
    extra = meta["project"]["optional-dependencies"]["jax"]
    assert f"jax[cpu]>={tj.TESTED_JAX[0]},<={tj.TESTED_JAX[-1]}" in extra, extra
    assert "absl-py" in extra, extra  # JAX 0.9.2's Pallas TPU module imports absl without requiring it


def _rms_norm_call():
    return rms_norm(256), (bf16(1024, 512), bf16(1, 512))


def test_an_op_the_reader_does_not_know_is_named_with_kernel_line_and_release(monkeypatch):
    fn, args = _rms_norm_call()
    name = tj.simulate(fn, *args)[0].kernel_name
    known = dict(tj._OP_ATTRS)
    del known["math.rsqrt"]
    monkeypatch.setattr(tj, "_OP_ATTRS", known)
    with pytest.raises(tpusim.InputError) as e:
        tj.simulate(fn, *args)
    msg = str(e.value)
    assert re.match(rf"kernel `{name}`, kernels\.py:\d+: `math\.rsqrt` is an op the reader does not know \(lowered by JAX ", msg), msg
    assert f"(lowered by JAX {jax.__version__}, a tested release)" in msg, msg


def test_an_attribute_the_reader_does_not_know_is_named(monkeypatch):
    known = dict(tj._OP_ATTRS)
    known["math.rsqrt"] = {}
    monkeypatch.setattr(tj, "_OP_ATTRS", known)
    fn, args = _rms_norm_call()
    with pytest.raises(tpusim.InputError, match=r"`math.rsqrt` has the attribute `fastmath` = .*which the reader does not know") as e:
        tj.simulate(fn, *args)
    assert re.match(r"kernel `[^`]+`, kernels\.py:\d+: .*\(lowered by JAX ", str(e.value)), str(e.value)


def test_an_attribute_value_the_reader_does_not_model_is_refused(monkeypatch):
    known = dict(tj._OP_ATTRS)
    known["math.rsqrt"] = {"fastmath": ("#arith.fastmath<fast>",)}
    monkeypatch.setattr(tj, "_OP_ATTRS", known)
    fn, args = _rms_norm_call()
    with pytest.raises(tpusim.InputError, match=r"`math.rsqrt` has `fastmath` = #arith.fastmath<none>, and the reader models it at #arith.fastmath<fast> only"):
        tj.simulate(fn, *args)


def test_under_a_newer_release_an_unknown_op_says_the_release_is_not_tested(monkeypatch):
    monkeypatch.setattr(jax, "__version__", "0.11.0")
    monkeypatch.setattr(tj, "_warned", {"0.11.0"})
    known = dict(tj._OP_ATTRS)
    del known["math.rsqrt"]
    monkeypatch.setattr(tj, "_OP_ATTRS", known)
    fn, args = _rms_norm_call()
    with pytest.raises(tpusim.InputError) as e:
        tj.simulate(fn, *args)
    msg = str(e.value)
    assert "(lowered by JAX 0.11.0, not a tested release" in msg and f"pip install 'jax[cpu]=={tj.TESTED_JAX[-1]}'" in msg, msg


def test_the_readers_ops_are_the_cost_tables():
    """Every vector op the reader passes on is one the Rust side prices, and every op the Rust side
    prices is one the reader knows the attributes of (the rest it reads itself)."""
    priced = set()
    for path in glob.glob(str(ROOT / "crates" / "*" / "src" / "**" / "*.rs"), recursive=True):
        priced |= set(re.findall(r'\("([a-z_]+\.[a-z_0-9]+)", OpCost::', open(path).read()))
    assert len(priced) > 50, "the Rust cost table was not found"
    assert set(tj._OP_ATTRS) - tj._READ_BY_THE_READER == priced, (
        sorted(set(tj._OP_ATTRS) - tj._READ_BY_THE_READER - priced), sorted(priced - set(tj._OP_ATTRS)))


def test_every_change_between_releases_names_a_release_and_its_handler():
    for release, what, where in tj.JAX_CHANGES:
        assert release in tj.TESTED_JAX and what, (release, what)
        m = re.match(r"(_\w+)\.(\w+)", where)
        if m:
            assert hasattr(getattr(tj, m.group(1)), m.group(2)), where
    for name, (release, method) in tj._REWRITES.items():
        assert release is None or release in tj.TESTED_JAX, (name, release)
        assert hasattr(tj._Reader, method) and any(method in where for _, _, where in tj.JAX_CHANGES), method


# ----------------------------------------------------------------------------------------------
# Predictions across releases


def _jax_of(python):
    r = subprocess.run([python, "-c", "import jax, tpusim; print(jax.__version__)"], capture_output=True, text=True, timeout=120)
    return r.stdout.strip() if r.returncode == 0 else None


def _reference():
    """The other environment's Python: $TPUSIM_JAX_REFERENCE (jax-releases.sh sets it; a missing
    or broken one fails the test), else the newest release's environment under target/ (the
    oldest's when this is the newest), else None."""
    given = os.environ.get("TPUSIM_JAX_REFERENCE")
    if given:
        version = _jax_of(given)
        assert version is not None, f"TPUSIM_JAX_REFERENCE={given}: not a Python with JAX and tpusim installed"
        return given, version
    want = tj.TESTED_JAX[0] if jax.__version__ == tj.TESTED_JAX[-1] else tj.TESTED_JAX[-1]
    for cand in (ROOT / "target" / "jax-envs" / want / "bin" / "python", ROOT / "target" / "py-venv" / "bin" / "python"):
        if cand.exists() and _jax_of(str(cand)) == want:
            return str(cand), want
    return None


def test_library_kernels_predict_bit_equal_under_another_release(tmp_path):
    """Flash attention, Splash forward and backward, paged and ragged paged attention and megablox
    gmm have the same source in every tested release apart from annotations, and the README's and
    the tutorial's kernels are our own: each predicts the same report, bit for bit, lowered under
    this release and under the other one; and a description the other release wrote runs with
    this tpusim's command line to the same latency."""
    ref = _reference()
    if ref is None:
        pytest.skip("no other release's environment (crates/tpusim-py/jax-releases.sh makes them under target/jax-envs)")
    python, version = ref
    assert version != jax.__version__, (version, jax.__version__)
    theirs_dir = tmp_path / "theirs"
    theirs_dir.mkdir()
    r = subprocess.run([python, os.path.join(HERE, "release_kernels.py"), str(theirs_dir)], capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    theirs = json.loads(r.stdout.strip().splitlines()[-1])
    assert theirs["jax"] == version
    import release_kernels

    ours = release_kernels.reports()
    assert set(ours) == set(theirs["reports"])
    for name, reps in ours.items():
        other = theirs["reports"][name]
        assert len(reps) == len(other), (name, len(reps), len(other))
        for a, b in zip(reps, other):
            assert a == b, (name, {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)})
    # The other release's descriptions record it, and this tpusim reads them.
    files = sorted(theirs_dir.glob("*.json"))
    assert len(files) == sum(len(v) for v in ours.values())
    names = list(release_kernels.CASES)
    for f in files:
        d = json.loads(f.read_text())
        assert d["producer"]["jax"] == version
        i, k, _ = f.name.split(".")
        rep = json.loads(run_cli("run", "--kernel-ir", f, "--format", "json")[0])
        assert rep["latency_ms"] == ours[names[int(i)]][int(k)]["latency_ms"], (f.name, names[int(i)])
