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
    let mut alias: Vec<usize> = (0..n).collect();
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
        let operands: Vec<usize> = op.operands.iter().map(|&v| alias[v]).collect();
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
                if let (Some(&src), Some(&dst)) = (operands.first(), op.results.first()) {
                    alias[dst] = src;
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
        let fused_into_readers = (op.op == "broadcast_in_dim" || (!joins && op.op == "convert")) && operands.len() == 1;
        if fused_into_readers && !op.results.iter().any(|r| is_output[*r]) {
            for &r in &op.results {
                alias[r] = operands[0];
                // Its readers now read the operand.
                elementwise_users[operands[0]] &= elementwise_users[r];
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
        grp.counts.flops += c.flops;
        grp.counts.transcendentals += c.transcendentals;
        grp.counts.bytes += c.bytes;
        for p in producer_groups {
            if p != g && !grp.deps.contains(&p) {
                grp.deps.push(p);
            }
        }
        if class == OpClass::Reduce {
            grp.closed = true;
        }
        group_of_op[i] = Some(g);
        for &r in &op.results {
            source[r] = Source::Group(g);
        }
    }
    // Rule 5: bytes after fusion.
    let mut used_outside: Vec<bool> = vec![false; n];
    for &o in &d.outputs {
        used_outside[alias[o]] = true;
    }
    for (i, op) in d.ops.iter().enumerate() {
        // Bitcasts and producers fused into their readers (rule 3) read nothing themselves.
        if group_of_op[i].is_none() && classes[i] != OpClass::Boundary {
            continue;
        }
        for &v in &op.operands {
            let v = alias[v];
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
            for &v in &d.ops[i].operands {
                let v = alias[v];
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
