"""The shared bad-input table (crates/tpusim/tests/data/bad-inputs.toml, also run through the
command line by crates/tpusim/tests/cli.rs): every value the CLI refuses, Python refuses with
tpusim.InputError and the same message, keyword first: `heads = '10': expected ...`."""

import math
import re
import tomllib

import pytest

import tpusim
from conftest import ROOT

TABLE = tomllib.loads((ROOT / "crates/tpusim/tests/data/bad-inputs.toml").read_text())["case"]
PY_CASES = [c for c in TABLE if "py" in c]


def as_keys(text):
    """`field` in a table message as the Python package names it (field)."""
    return re.sub(r"`([a-z_]+)`", r"\1", text)


@pytest.mark.parametrize("case", PY_CASES, ids=[f"{c.get('fn', 'run')}-{c['key']}={c['py']}" for c in PY_CASES])
def test_the_shared_bad_input_table_raises_input_error_naming_the_keyword(case):
    value = eval(case["py"], {"nan": math.nan, "inf": math.inf})  # noqa: S307 - the table's literals
    assert repr(value) == case["py"], "the table writes values as repr() shows them"
    call = {"run": tpusim.simulate, "tune": tpusim.tune}[case.get("fn", "run")]
    kwargs = {**case.get("with", {}), case["key"]: value}
    with pytest.raises(tpusim.InputError) as e:
        call(**kwargs)
    assert str(e.value) == f"{case['key']} = {case['py']}: {as_keys(case['error'])}"


def test_the_table_covers_both_front_ends():
    assert len(PY_CASES) >= 20
    assert sum("cli" in c and "py" in c for c in TABLE) >= 15


def test_misuse_raises_input_error_not_type_or_overflow_errors():
    for call, msg in [
        (lambda: tpusim.sweep(5), "points = 5: expected a list"),
        (lambda: tpusim.sweep(None), "points = None: expected a list"),
        (lambda: tpusim.sweep([5]), r"points\[0\] = 5: expected a dict"),
        (lambda: tpusim.validate(None), "rows = None: expected a measurement CSV path"),
        (lambda: tpusim.validate([]), r"rows = \[\]: no measurement rows"),
        (lambda: tpusim.tile_counts("causal", 512, -1, q_len=4096, kv_len=4096), "block_kv = -1: expected a whole number from 1"),
        (lambda: tpusim.tile_counts("causal", 512.0, 512, q_len=4096, kv_len=4096), "block_q = 512.0: expected a whole number from 1"),
        (lambda: tpusim.tune(allow_inexact="yes"), "allow_inexact = 'yes': expected true or false"),
        # refine is a count (the stub said bool); the message gives no u64 bound.
        (lambda: tpusim.tune(refine=True), r"refine = True: expected a whole number from 1$"),
        (lambda: tpusim.tune(top=0), r"top = 0: expected a whole number from 1$"),
        (lambda: tpusim.simulate(hedas=4), "hedas = 4: not a job keyword"),
        (lambda: tpusim.simulate(block_sizes={"block_q": "512"}), "block_q = '512': expected a whole number"),
    ]:
        with pytest.raises(tpusim.InputError, match=msg):
            call()
