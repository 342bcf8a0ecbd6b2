//! A layer's timeline as Chrome Trace Event JSON (Perfetto, `chrome://tracing`): one track for
//! the TensorCore's ops, one per unit (MXU, VPU, EUP, XLU, HBM, step control: each op's busy time
//! on the unit, from its start), and one for the ICI (the collectives).
//!
//! Complete events (`"ph": "X"`) with `ts` and `dur` in microseconds; `args` give the op's
//! category and detail. Process 1 is the chip; threads 1..=8 the tracks, named by metadata
//! events.

use crate::sim::{LayerResult, Resource};
use serde_json::{json, Value};
use tpusim_model::Unit;

/// Track names in display order: ops, the six units, ICI.
pub const TRACKS: [&str; 8] = ["TensorCore ops", "MXU", "VPU", "EUP", "XLU", "HBM", "step control", "ICI"];

/// The Chrome trace of one layer (module docs).
pub fn chrome_trace(r: &LayerResult) -> Value {
    let us = 1e6;
    let mut events = Vec::new();
    for (tid, name) in TRACKS.iter().enumerate() {
        let tid = tid + 1;
        events.push(json!({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name", "args": {"name": name}}));
        events.push(json!({"ph": "M", "pid": 1, "tid": tid, "name": "thread_sort_index", "args": {"sort_index": tid}}));
    }
    events.push(json!({"ph": "M", "pid": 1, "name": "process_name", "args": {"name": format!("{} (one chip of {})", r.plan.chip.name, r.plan.slice.label())}}));
    for (i, op) in r.graph.ops() {
        let (c, s) = (&r.costs[i.index()], &r.schedule[i.index()]);
        let args = json!({"category": op.category.word(), "detail": c.detail});
        let dur = s.end - s.start;
        match s.resource {
            Resource::Ici => events.push(
                json!({"ph": "X", "pid": 1, "tid": 8, "name": op.name, "cat": "ici", "ts": s.start * us, "dur": dur * us, "args": args}),
            ),
            Resource::Core => {
                events.push(
                    json!({"ph": "X", "pid": 1, "tid": 1, "name": op.name, "cat": "op", "ts": s.start * us, "dur": dur * us, "args": args}),
                );
                for (k, u) in Unit::ALL.iter().enumerate() {
                    let b = c.busy_s[*u].min(dur);
                    if b > 0.0 {
                        events.push(json!({"ph": "X", "pid": 1, "tid": k + 2, "name": op.name, "cat": u.word(), "ts": s.start * us, "dur": b * us, "args": args}));
                    }
                }
            }
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"tool": "tpusim layer", "latency_ms": r.seconds * 1e3}})
}
