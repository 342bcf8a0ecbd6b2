"""The agreement table of traces/measured/VALIDATION.md holds: every configuration of
`agreement.py` lowered by JAX, read from its Mosaic IR and simulated, against the hand model of
its family. Both front ends build their bodies from op sequences through the one body builder:
the distinct step bodies that ran (op count and signature, with their step counts), the pipeline
around them (steps computed, the VMEM buffers in order, every grid step's copies), the counts
and the latency are equal exactly. Known misses are strict xfails: each fails this test the day
it is fixed, so that the table and this list are updated together."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import agreement  # noqa: E402
import tpusim  # noqa: E402

#: Rows that miss, with the side that is wrong or why it is open (VALIDATION.md says the same).
#: None: every row's bodies, counts and latency are equal.
KNOWN_MISSES: dict = {}


def _params():
    out = []
    for c in agreement.configs():
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[c[0]])] if c[0] in KNOWN_MISSES else []
        out.append(pytest.param(*c, marks=marks, id=f"{c[0]} {c[1]}"))
    return out


@pytest.mark.parametrize("name,chip,ir,kw", _params())
def test_ir_path_agrees_with_the_hand_model(name, chip, ir, kw):
    r = ir()
    hand = agreement.hand(kw)
    for f in agreement.FIELDS:
        assert getattr(r, f) == agreement.hand_value(hand, f), (f, getattr(r, f), agreement.hand_value(hand, f))
    assert agreement.bodies(r) == agreement.bodies(hand), (agreement.bodies(r), agreement.bodies(hand))
    # The pipeline around the bodies: steps computed, VMEM buffers in order, every step's copies.
    p_ir, p_hand = agreement.pipeline(r), agreement.pipeline(hand)
    assert p_ir == p_hand, agreement.pipeline_diff(p_ir, p_hand)
    assert r.latency_ms == hand.latency_ms, (r.latency_ms, hand.latency_ms)


def test_known_misses_are_rows_of_the_table():
    names = {c[0] for c in agreement.configs()}
    assert set(KNOWN_MISSES) <= names
