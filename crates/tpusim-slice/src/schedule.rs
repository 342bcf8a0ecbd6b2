//! The one schedule of a slice program (a DiT block's ops, a jitted program's fusion groups) on
//! one chip: two queues, the TensorCore and the ICI.
//!
//! * **Issue order** ([`issue_order`]): program order, with each collective moved to just after
//!   the last op it reads (before compute that does not feed it), as XLA's latency-hiding
//!   scheduler starts collectives early.
//! * **TensorCore ops** (fusions, dots, kernels) run one at a time in issue order, each when its
//!   inputs are done and the core is free (XLA runs one op at a time on a core).
//! * **Collectives** are asynchronous: the TensorCore issues one (its `issue_seconds`: one DMA
//!   issue per message the device sends, `fitted.dma_issue_ns`, a named assumption of the chip
//!   model) when its inputs are done and the core is free, then it runs on the ICI, one at a
//!   time, concurrently with later compute; its consumers wait for its end. So a transfer that
//!   hides behind compute costs the compute plus its issue time; the latency is at least the
//!   larger of the compute-only and ICI-only schedules and at most their sum.
//! * **Without overlap** (`overlap = false`, `tpusim layer --overlap=false`) every op shares the
//!   TensorCore's queue: collectives serialise with compute.

use serde::Serialize;

/// Which queue an op runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Queue {
    /// The TensorCore.
    Core,
    /// The inter-chip interconnect.
    Ici,
}

/// One op of a slice program, as the schedule sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct SliceOp {
    /// Its queue.
    pub queue: Queue,
    /// Time on its queue, seconds.
    pub seconds: f64,
    /// TensorCore time to issue a collective, seconds (0 for TensorCore ops).
    pub issue_seconds: f64,
    /// The ops whose results it reads (indices into the program, each less than its own).
    pub deps: Vec<usize>,
}

/// A slice program scheduled.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// Latency, seconds: the last op's end.
    pub seconds: f64,
    /// Each op's (start, end), seconds from the program's start, in program order.
    pub spans: Vec<(f64, f64)>,
    /// The TensorCore's idle time just before each op, seconds, waiting for the op's inputs: for
    /// a TensorCore op (and, without overlap, any op) its start minus the end of the core's
    /// previous op or issue; for a collective, before its issue. A front end that splits the
    /// latency by op charges it to the input waited for.
    pub core_waited: Vec<f64>,
    /// When the TensorCore finished its last op or issue, seconds (the latency minus any
    /// collective that ends after it).
    pub core_seconds: f64,
}

/// The issue order of `ops` (module docs): program order with each collective moved to just
/// after the last op it reads.
pub fn issue_order(ops: &[SliceOp]) -> Vec<usize> {
    let mut keyed: Vec<(f64, usize)> = ops
        .iter()
        .enumerate()
        .map(|(i, o)| {
            let k = if o.queue == Queue::Ici { o.deps.iter().map(|&d| d as f64).fold(-1.0, f64::max) + 0.5 } else { i as f64 };
            (k, i)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// Schedules `ops` in `order` ([`issue_order`]) by the module's rule, TensorCore times scaled by
/// `core` and ICI times by `ici` (1, or 0 for the ICI-only and compute-only schedules).
///
/// # Panics
/// When an op reads an op that `order` has not scheduled before it (never for [`issue_order`]
/// of ops whose dependencies precede them).
pub fn schedule(ops: &[SliceOp], order: &[usize], overlap: bool, core: f64, ici: f64) -> Schedule {
    let mut spans = vec![(f64::NAN, f64::NAN); ops.len()];
    let mut core_waited = vec![0.0; ops.len()];
    let (mut core_free, mut ici_free) = (0.0f64, 0.0f64);
    for &i in order {
        let o = &ops[i];
        let ready = o.deps.iter().map(|&d| {
            let end = spans[d].1;
            assert!(!end.is_nan(), "op {i} reads op {d}, which is not scheduled before it");
            end
        });
        let ready = ready.fold(0.0, f64::max);
        let scale = if o.queue == Queue::Ici { ici } else { core };
        if o.queue == Queue::Ici && overlap {
            let issue_at = ready.max(core_free);
            core_waited[i] = issue_at - core_free;
            core_free = issue_at + o.issue_seconds;
            let start = core_free.max(ici_free);
            let end = start + o.seconds * scale;
            ici_free = end;
            spans[i] = (start, end);
        } else {
            let start = ready.max(core_free);
            core_waited[i] = start - core_free;
            let end = start + o.issue_seconds + o.seconds * scale;
            core_free = end;
            spans[i] = (start, end);
        }
    }
    let seconds = spans.iter().map(|s| s.1).filter(|e| !e.is_nan()).fold(core_free, f64::max);
    Schedule { seconds, spans, core_waited, core_seconds: core_free }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn core(s: f64, deps: &[usize]) -> SliceOp {
        SliceOp { queue: Queue::Core, seconds: s, issue_seconds: 0.0, deps: deps.to_vec() }
    }

    fn ici(s: f64, issue: f64, deps: &[usize]) -> SliceOp {
        SliceOp { queue: Queue::Ici, seconds: s, issue_seconds: issue, deps: deps.to_vec() }
    }

    #[test]
    fn a_collective_hides_behind_independent_compute_and_its_consumer_waits() {
        // 0: produce; 1: compute that does not feed the exchange; 2: exchange of 0; 3: reads 2.
        let ops = vec![core(1.0, &[]), core(3.0, &[]), ici(2.0, 0.25, &[0]), core(1.0, &[2, 1])];
        let order = issue_order(&ops);
        assert_eq!(order, vec![0, 2, 1, 3], "the collective issues right after its producer");
        let s = schedule(&ops, &order, true, 1.0, 1.0);
        assert_eq!(s.spans[2], (1.25, 3.25), "issued at 1.0 for 0.25, then on the ICI");
        assert_eq!(s.spans[1], (1.25, 4.25), "the issue delays the core");
        assert_eq!(s.spans[3], (4.25, 5.25));
        assert_eq!((s.seconds, s.core_seconds), (5.25, 5.25));
        assert_eq!(s.core_waited, vec![0.0, 0.0, 0.0, 0.0], "the core never idles: the exchange hides behind op 1");
        // Op 3 waits for the exchange when op 1 is short.
        let mut short = ops.clone();
        short[1].seconds = 0.5;
        let w = schedule(&short, &order, true, 1.0, 1.0);
        assert_eq!((w.spans[3], w.core_waited[3]), ((3.25, 4.25), 1.5));
        // Bounds: at least the larger of compute-only and ICI-only, at most their sum.
        let c = schedule(&ops, &order, true, 1.0, 0.0).seconds;
        let i = schedule(&ops, &order, true, 0.0, 1.0).seconds;
        assert!(c.max(i) <= s.seconds && s.seconds <= c + i, "{c} {i} {}", s.seconds);
    }

    #[test]
    fn without_overlap_collectives_serialise_with_compute() {
        let ops = vec![core(1.0, &[]), core(3.0, &[]), ici(2.0, 0.25, &[0]), core(1.0, &[2, 1])];
        let order = issue_order(&ops);
        let s = schedule(&ops, &order, false, 1.0, 1.0);
        assert_eq!(s.seconds, 1.0 + 2.25 + 3.0 + 1.0);
        assert_eq!(s.core_waited, vec![0.0, 0.0, 0.0, 0.0], "serialised in issue order: the core never waits");
    }
}
