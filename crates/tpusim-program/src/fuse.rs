//! The program's ops grouped as XLA would run them: fusions, dots, collectives, Pallas kernels.
//!
//! **The fusion rule** (a simplified form of XLA's instruction fusion, stated so a reader can
//! check it by hand):
//!
//! 1. Dots, Pallas kernels and collectives each start their own group. A dot's group takes its
//!    element-wise and transcendental consumers (output fusion, as XLA fuses a bias add or an
//!    activation into a dot's output, and `tpusim layer` assumes for bias and GELU) while every
//!    user of the value they read from it is element-wise and their result is no wider per
//!    element than the dot's: the dot then writes only what leaves the chain. Reductions and
//!    data movement never join a dot, and nothing joins a kernel or a collective.
//! 2. A reshape is a bitcast: its result is its operand (no group, no bytes).
//! 3. A value computed only from constants and iotas by fusible ops (a broadcast constant, an
//!    iota mask) is not a group: each fusion that reads it recomputes it, reading only the
//!    constants. Likewise every broadcast (a bias, a norm's weight, a row statistic) and a
//!    convert that would start a fusion of its own (an upcast of an input or of another group's
//!    result): each reader fuses it and reads its operand (XLA duplicates such cheap producers
//!    into their consumers), unless it is a program output.
//! 4. Any other fusible op (element-wise, transcendental, convert, data movement, reduce) joins
//!    the group of its latest-created producer if that group is an open fusion (or a dot, for
//!    an element-wise op: rule 1), else starts a new fusion. A reduce closes its fusion (a
//!    reduction is a fusion's root). Groups are created in program order and each joins only
//!    the latest of its producers' groups, so a group depends only on earlier groups: no
//!    cycles.
//! 5. A fusion (and a dot with its output fusion) makes one HBM round trip: it reads each
//!    distinct value it takes from outside (arguments, shards, other groups' results,
//!    constants) once, and writes each of its results that an op outside it, or the program's
//!    output, uses.
//! 6. Producer fusion of per-row work on reductions: an element-wise or transcendental op whose
//!    operands are all reduce results, values made by this rule, or constant-like values (a
//!    mean `sum / n`, `rsqrt(var + eps)`) is not a group: each reader recomputes it, reading
//!    only the reduce results and constants (XLA fuses such cheap producers into the consumer
//!    that broadcasts them), unless it is a program output.
//! 7. An element-wise (not transcendental) intermediate of a fusion a reduce closed, read by a
//!    later op (`x - mean` feeding both the variance's reduce and the normalisation), is
//!    recomputed by that reader from what it was made of (XLA duplicates cheap element-wise
//!    producers into each consumer): the closed fusion does not write it.
//! 8. Multi-output fusion of reductions: a fusion closed by a reduce merges into an earlier
//!    fusion closed by a reduce with the same result shape when both read one value larger than
//!    that result from outside (the same input, so the merged fusion reads it once) and the later
//!    one waits for no group created after the earlier one. This covers sibling reductions
//!    (XLA's sibling multi-output fusion: `sum(x)` and `sum(x * x)`) and a reduction of the same
//!    input that reads the earlier one's row result (the two-pass variance `sum((x - mean)^2)`,
//!    one pass over x with the row on chip, as XLA's TPU reduction fusions keep a row in VMEM).
//!    A LayerNorm is then two fusions (statistics: read x, write two row vectors; normalise:
//!    read x and the rows, write y) and an RMSNorm two (x, one row; x and the row, y).

use crate::desc::{dtype_bytes, ProgramDescription, ValueKind};
use crate::ops::{classify, counts, OpClass, OpCounts};
use crate::ProgramError;
use serde::Serialize;
use std::collections::BTreeSet;

/// What a group is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// A fusion of fusible ops (HBM-bound, one round trip).
    Fusion,
    /// A dot on the MXU, with the element-wise ops fused into its output.
    Dot,
    /// A collective on the ICI.
    Collective,
    /// A Pallas kernel.
    Kernel,
}

/// A group of ops that runs as one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    /// Its kind.
    pub kind: GroupKind,
    /// Member op indices, in program order.
    pub ops: Vec<usize>,
    /// Groups it waits for (indices, all lower than its own).
    pub deps: Vec<usize>,
    /// Bytes it reads from HBM after fusion (fusions and dots; kernels and collectives 0 here).
    pub read_bytes: u64,
    /// Bytes it writes to HBM after fusion.
    pub write_bytes: u64,
    /// The members' counts summed before fusion.
    pub counts: OpCounts,
    /// A reduce closed it (fusions only).
    #[serde(skip)]
    closed: bool,
}

/// The program grouped, with each op's class and counts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grouped {
    /// Groups in creation order (a topological order).
    pub groups: Vec<Group>,
    /// Each op's class, in program order.
    pub classes: Vec<OpClass>,
    /// Each op's counts before fusion, in program order.
    pub counts: Vec<OpCounts>,
}

/// What produces a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// In HBM from the start (argument, shard, constant) or made by a boundary op.
    Memory,
    /// Recomputed from constants by each reader (rule 3).
    ConstantLike,
    /// A group's result.
    Group(usize),
    /// In HBM once a group is done (a `shard_map` boundary's result).
    After(usize),
}

/// Groups the program's ops (module docs).
///
/// # Errors
/// [`ProgramError::Op`] for an op that is not modelled ([`classify`]) or malformed.
pub fn group(d: &ProgramDescription) -> Result<Grouped, ProgramError> {
    let n = d.values.len();
    let mut source: Vec<Source> = d.values.iter().map(|_| Source::Memory).collect();
    // What reading a value reads in HBM: itself, or (a bitcast, a producer each reader fuses, a
    // row statistic, a recomputed intermediate: rules 2, 3, 6, 7) the values it is made from.
    let mut reads: Vec<Vec<usize>> = (0..n).map(|v| vec![v]).collect();
    // A reduce's result, or a value computed from such results and constants (rule 6).
    let mut row: Vec<bool> = vec![false; n];
    // The values an element-wise op in a fusion read, by its result (rule 7).
    let mut made_from: Vec<Option<Vec<usize>>> = vec![None; n];
    // Each op's operands as it reads them (after rules 2, 3, 6, 7).
    let mut op_reads: Vec<Vec<usize>> = vec![Vec::new(); d.ops.len()];
    // Constant bytes behind a constant-like value (rule 3).
    let mut const_bytes: Vec<u64> = vec![0; n];
    for (i, v) in d.values.iter().enumerate() {
        if v.kind == ValueKind::Constant {
            source[i] = Source::ConstantLike;
            const_bytes[i] = v.bytes()?;
        }
    }
    // Whether every user of a value is an element-wise op (a program output is not), through
    // bitcasts: the condition for a dot's output fusion to take it (rule 1).
    let mut elementwise_users: Vec<bool> = vec![true; n];
    {
        let mut al: Vec<usize> = (0..n).collect();
        for op in &d.ops {
            if op.op == "reshape" {
                if let (Some(&s), Some(&r)) = (op.operands.first(), op.results.first()) {
                    al[r] = al[s];
                }
                continue;
            }
            let ew = matches!(classify(op, d.kernels.len()), Ok(OpClass::Elementwise | OpClass::Transcendental));
            let bc = op.op == "broadcast_in_dim";
            for &v in &op.operands {
                if !(ew || bc) {
                    elementwise_users[al[v]] = false;
                }
            }
        }
        for &o in &d.outputs {
            elementwise_users[al[o]] = false;
        }
    }
    let mut is_output = vec![false; n];
    for &o in &d.outputs {
        is_output[o] = true;
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut group_of_op: Vec<Option<usize>> = vec![None; d.ops.len()];
    let mut classes = Vec::with_capacity(d.ops.len());
    let mut all_counts = Vec::with_capacity(d.ops.len());
    for (i, op) in d.ops.iter().enumerate() {
        let class = classify(op, d.kernels.len())?;
        let c = counts(d, op, class)?;
        classes.push(class);
        all_counts.push(c);
        // Rule 7: an element-wise intermediate of a closed fusion is recomputed by its reader.
        let mut operands: Vec<usize> = Vec::new();
        let mut stack: Vec<usize> = op.operands.iter().rev().flat_map(|&v| reads[v].iter().rev().copied()).collect();
        while let Some(u) = stack.pop() {
            let recompute = match (source[u], &made_from[u]) {
                (Source::Group(g), Some(_)) => groups[g].kind == GroupKind::Fusion && groups[g].closed,
                _ => false,
            };
            if recompute {
                stack.extend(made_from[u].iter().flatten().rev().copied());
            } else if !operands.contains(&u) {
                operands.push(u);
            }
        }
        let producer_groups: BTreeSet<usize> = operands
            .iter()
            .filter_map(|&v| match source[v] {
                Source::Group(g) | Source::After(g) => Some(g),
                _ => None,
            })
            .collect();
        let joinable = |g: usize| operands.iter().any(|&v| source[v] == Source::Group(g));
        let chain_from = |g: usize| operands.iter().filter(|&&v| source[v] == Source::Group(g)).all(|&v| elementwise_users[v]);
        let fusible = matches!(class, OpClass::Elementwise | OpClass::Transcendental | OpClass::Movement | OpClass::Reduce);
        match class {
            OpClass::Bitcast => {
                if let Some(&dst) = op.results.first() {
                    reads[dst] = operands.clone();
                }
                continue;
            }
            OpClass::Boundary => {
                // Results are in HBM (a shard is the device's part of its operand) once the
                // operands' groups are done.
                let after = producer_groups.iter().next_back().map_or(Source::Memory, |&g| Source::After(g));
                for &r in &op.results {
                    source[r] = after;
                }
                continue;
            }
            _ => {}
        }
        if fusible && producer_groups.is_empty() && operands.iter().all(|&v| source[v] == Source::ConstantLike) && class != OpClass::Reduce
        {
            let b: u64 = operands.iter().map(|&v| const_bytes[v]).sum();
            for &r in &op.results {
                source[r] = Source::ConstantLike;
                const_bytes[r] = b;
            }
            continue;
        }
        // Rule 6: a per-row computation on reduce results is recomputed by each reader.
        let on_rows = operands.iter().all(|&v| row[v] || source[v] == Source::ConstantLike) && operands.iter().any(|&v| row[v]);
        if matches!(class, OpClass::Elementwise | OpClass::Transcendental) && on_rows && !op.results.iter().any(|r| is_output[*r]) {
            for &r in &op.results {
                reads[r] = operands.clone();
                row[r] = true;
                for &u in &operands {
                    elementwise_users[u] &= elementwise_users[r];
                }
            }
            continue;
        }
        let latest = producer_groups.iter().next_back().copied();
        // A result wider per element than the dot's own would make the dot write more bytes.
        let widens = |g: usize| -> bool {
            let dot_result = groups[g].ops.first().and_then(|&i| d.ops[i].results.first());
            match (dot_result, op.results.first()) {
                (Some(&a), Some(&r)) => dtype_bytes(&d.values[r].dtype).unwrap_or(0) > dtype_bytes(&d.values[a].dtype).unwrap_or(0),
                _ => false,
            }
        };
        let joins = latest.is_some_and(|g| {
            fusible
                && joinable(g)
                && ((groups[g].kind == GroupKind::Fusion && !groups[g].closed)
                    || (groups[g].kind == GroupKind::Dot
                        && matches!(class, OpClass::Elementwise | OpClass::Transcendental)
                        && chain_from(g)
                        && !widens(g)))
        });
        // Rule 3: a broadcast or convert that would start a fusion of its own is fused into each
        // of its readers instead (they read its operand), unless it is a program output.
        let fused_into_readers = (op.op == "broadcast_in_dim" || (!joins && op.op == "convert")) && op.operands.len() == 1;
        if fused_into_readers && !op.results.iter().any(|r| is_output[*r]) {
            for &r in &op.results {
                reads[r] = operands.clone();
                // Its readers now read the operand.
                for &u in &operands {
                    elementwise_users[u] &= elementwise_users[r];
                }
            }
            continue;
        }
        let g = match latest {
            Some(g) if joins => g,
            _ => {
                let kind = match class {
                    OpClass::Dot => GroupKind::Dot,
                    OpClass::Collective(_) => GroupKind::Collective,
                    OpClass::Kernel(_) => GroupKind::Kernel,
                    _ => GroupKind::Fusion,
                };
                groups.push(Group { kind, ops: Vec::new(), deps: Vec::new(), read_bytes: 0, write_bytes: 0, counts: OpCounts::default(), closed: false });
                groups.len() - 1
            }
        };
        let grp = &mut groups[g];
        grp.ops.push(i);
        grp.counts += c;
        for p in producer_groups {
            if p != g && !grp.deps.contains(&p) {
                grp.deps.push(p);
            }
        }
        if class == OpClass::Reduce {
            grp.closed = true;
        }
        let kind = grp.kind;
        group_of_op[i] = Some(g);
        for &r in &op.results {
            source[r] = Source::Group(g);
            row[r] = class == OpClass::Reduce;
            if kind == GroupKind::Fusion && class == OpClass::Elementwise {
                made_from[r] = Some(operands.clone());
            }
        }
        op_reads[i] = operands;
    }
    // Rule 8: reductions over the same input merge into one multi-output fusion.
    let mut into: Vec<usize> = (0..groups.len()).collect();
    let root = |grp: &Group| grp.ops.last().and_then(|&i| d.ops[i].results.first()).map(|&r| &d.values[r]);
    for g2 in 0..groups.len() {
        if !(groups[g2].kind == GroupKind::Fusion && groups[g2].closed) {
            continue;
        }
        let outside = |g: usize, source: &[Source]| -> BTreeSet<usize> {
            groups[g].ops.iter().flat_map(|&i| op_reads[i].iter().copied()).filter(|&u| source[u] != Source::Group(g)).collect()
        };
        let r2 = root(&groups[g2]).map(|v| (v.shape.clone(), v.bytes()));
        let reads2 = outside(g2, &source);
        let deps2: Vec<usize> = groups[g2].deps.iter().map(|&x| into[x]).collect();
        let mut target = None;
        for g1 in (0..g2).rev() {
            if into[g1] != g1 || !(groups[g1].kind == GroupKind::Fusion && groups[g1].closed) || deps2.iter().any(|&x| x > g1) {
                continue;
            }
            let r1 = root(&groups[g1]).map(|v| (v.shape.clone(), v.bytes()));
            let (Some((s1, Ok(b1))), Some((s2, _))) = (&r1, &r2) else { continue };
            if s1 != s2 {
                continue;
            }
            let shared = outside(g1, &source)
                .intersection(&reads2)
                .any(|&u| source[u] != Source::ConstantLike && d.values[u].bytes().is_ok_and(|b| b > *b1));
            if shared {
                target = Some(g1);
                break;
            }
        }
        let Some(g1) = target else { continue };
        into[g2] = g1;
        let moved = std::mem::take(&mut groups[g2].ops);
        for &i in &moved {
            for &r in &d.ops[i].results {
                if source[r] == Source::Group(g2) {
                    source[r] = Source::Group(g1);
                }
            }
        }
        let c2 = groups[g2].counts;
        let g1m = &mut groups[g1];
        g1m.ops.extend(moved);
        g1m.ops.sort_unstable();
        g1m.counts += c2;
        for x in deps2 {
            if x != g1 && !g1m.deps.contains(&x) {
                g1m.deps.push(x);
            }
        }
    }
    // Drop the merged groups and renumber.
    let mut new_index: Vec<usize> = vec![0; groups.len()];
    let mut next = 0;
    for g in 0..groups.len() {
        if into[g] == g {
            new_index[g] = next;
            next += 1;
        }
    }
    let renumber = |g: usize| new_index[into[g]];
    let mut kept = Vec::with_capacity(next);
    for (g, mut grp) in groups.into_iter().enumerate() {
        if into[g] != g {
            continue;
        }
        let me = new_index[g];
        let mut deps: Vec<usize> = Vec::new();
        for x in grp.deps.iter().map(|&x| renumber(x)) {
            if x != me && !deps.contains(&x) {
                deps.push(x);
            }
        }
        grp.deps = deps;
        kept.push(grp);
    }
    let mut groups = kept;
    for s in source.iter_mut() {
        match *s {
            Source::Group(g) => *s = Source::Group(renumber(g)),
            Source::After(g) => *s = Source::After(renumber(g)),
            _ => {}
        }
    }
    for g in group_of_op.iter_mut().flatten() {
        *g = renumber(*g);
    }
    // Rule 5: bytes after fusion.
    let mut used_outside: Vec<bool> = vec![false; n];
    for &o in &d.outputs {
        for &u in &reads[o] {
            used_outside[u] = true;
        }
    }
    for (i, op) in d.ops.iter().enumerate() {
        // Bitcasts and producers fused into their readers (rule 3) read nothing themselves.
        if group_of_op[i].is_none() && classes[i] != OpClass::Boundary {
            continue;
        }
        let boundary_reads: Vec<usize>;
        let rd = if classes[i] == OpClass::Boundary {
            boundary_reads = op.operands.iter().flat_map(|&v| reads[v].iter().copied()).collect();
            &boundary_reads
        } else {
            &op_reads[i]
        };
        for &v in rd {
            if let Source::Group(p) = source[v] {
                if group_of_op[i] != Some(p) {
                    used_outside[v] = true;
                }
            }
        }
    }
    for (g, grp) in groups.iter_mut().enumerate() {
        if matches!(grp.kind, GroupKind::Kernel | GroupKind::Collective) {
            continue;
        }
        let mut read: BTreeSet<usize> = BTreeSet::new();
        let mut written: BTreeSet<usize> = BTreeSet::new();
        for &i in &grp.ops {
            for &v in &op_reads[i] {
                if source[v] != Source::Group(g) {
                    read.insert(v);
                }
            }
            for &r in &d.ops[i].results {
                if used_outside[r] {
                    written.insert(r);
                }
            }
        }
        for v in read {
            grp.read_bytes += match source[v] {
                Source::ConstantLike => const_bytes[v],
                _ => d.values[v].bytes()?,
            };
        }
        for v in written {
            grp.write_bytes += d.values[v].bytes()?;
        }
    }
    Ok(Grouped { groups, classes, counts: all_counts })
}
