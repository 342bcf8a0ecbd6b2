//! Copies a kernel starts in its body (`tpu.enqueue_dma`) and waits for (`tpu.wait_dma2`) on the
//! IR path: a copy overlaps the work after it until a wait needs it; a wait counts the copies on
//! its semaphore, earliest first, up to the bytes it waits for; everything after a wait waits for
//! it; the copies' bytes are the run's HBM traffic.

use serde_json::{json, Value};
use tpusim_chip::ChipModel;
use tpusim_job::{DescribedJob, Job, Report};

/// Bytes of one f32 block of 512 x 1024 (2 MiB).
const BLOCK: u64 = 512 * 1024 * 4;

/// A start of a copy of `bytes` signalling semaphore `sem`.
fn start(id: u64, bytes: u64, sem: i64) -> Value {
    json!({"op": "tpu.enqueue_dma", "id": id, "loc": format!("k.py:{id}"),
           "attrs": {"bytes": bytes, "sem_ref": 3, "sem_offsets": [sem]}})
}

/// A wait on semaphore `sem` for `bytes` (all of its copies when `None`).
fn wait(id: u64, bytes: Option<u64>, sem: i64) -> Value {
    let mut attrs = json!({"sem_ref": 3, "sem_offsets": [sem]});
    if let Some(b) = bytes {
        attrs["bytes"] = json!(b);
    }
    json!({"op": "tpu.wait_dma2", "id": id, "loc": format!("k.py:{id}"), "attrs": attrs})
}

/// VPU work on the scratch block: `n` chained tanh-free element-wise ops on 512 x 1024 f32.
fn compute(first_id: u64, n: u64) -> Vec<Value> {
    let mut ops = vec![json!({"op": "vector.load", "id": first_id, "operands": [{"ref": 2}, {"scalar": 0}, {"scalar": 0}],
                              "shape": [512, 1024], "dtype": "f32", "loc": "k.py:100"})];
    for k in 1..=n {
        ops.push(json!({"op": "arith.mulf", "id": first_id + k, "operands": [{"op": first_id + k - 1}, {"op": first_id + k - 1}],
                        "shape": [512, 1024], "dtype": "f32", "loc": "k.py:101"}));
    }
    ops
}

/// A one-step kernel with `body`, an HBM input, a VMEM scratch block, two DMA semaphores and a
/// bf16 scratch block (the matmuls' operands).
fn kernel(body: Vec<Value>) -> Value {
    kernel_steps(body, 1)
}

/// [`kernel`] over `steps` grid steps.
fn kernel_steps(body: Vec<Value>, steps: u64) -> Value {
    json!({
        "format": "tpusim-kernel-description", "version": 1, "kernel_name": "copies",
        "kernel_metadata": null, "producer": {"tool": "test", "jax": "", "device_kind": "", "mosaic_version": 11},
        "grid": [steps], "dimension_semantics": ["arbitrary"], "vmem_limit_bytes": null, "cost_estimate": null,
        "refs": [
            {"name": "input 0", "kind": "input", "shape": [8192, 1024], "array_shape": [8192, 1024], "dtype": "f32", "memory_space": "any"},
            {"name": "output 0", "kind": "output", "shape": [512, 1024], "array_shape": [512, 1024], "dtype": "f32", "memory_space": "any"},
            {"name": "scratch 0", "kind": "scratch", "shape": [512, 1024], "dtype": "f32", "memory_space": "vmem"},
            {"name": "scratch 1", "kind": "scratch", "shape": [2], "dtype": "i32", "memory_space": "semaphore"},
            {"name": "scratch 2", "kind": "scratch", "shape": [512, 512], "dtype": "bf16", "memory_space": "vmem"}
        ],
        "body": body
    })
}

fn run(v: &Value) -> Report {
    run_on(&ChipModel::preset("v6e").expect("preset"), v).expect("simulates")
}

fn run_on(chip: &ChipModel, v: &Value) -> Result<Report, String> {
    let d = tpusim_pallas::Description::from_json(&v.to_string(), "copies.json").map_err(|e| e.to_string())?;
    let job = Job::Described(DescribedJob::new("copies.json", d, "."));
    tpusim_job::run(chip, &job).map(|r| Report::from_run(&r)).map_err(|e| e.to_string())
}

/// `then` on grid step `step` only.
fn on_step(step: i64, then: Vec<Value>) -> Value {
    json!({"op": "scf.if", "id": 900 + step as u64, "loc": "k.py:90", "cond": ["eq", ["grid", 0], step], "then": then})
}

fn cat(parts: Vec<Vec<Value>>) -> Vec<Value> {
    parts.into_iter().flatten().collect()
}

#[test]
fn a_copy_overlaps_the_work_before_its_wait() {
    // Four blocks copied, then VPU work, then the wait: the copy runs under the work.
    let copies = || (0..4).map(|i| start(1 + i, BLOCK, 0)).collect::<Vec<_>>();
    let overlapped = run(&kernel(cat(vec![copies(), compute(10, 24), vec![wait(50, Some(4 * BLOCK), 0)]])));
    // The same with the wait first: the work waits for the copies.
    let serial = run(&kernel(cat(vec![copies(), vec![wait(50, Some(4 * BLOCK), 0)], compute(10, 24)])));
    let copy_only = run(&kernel(cat(vec![copies(), vec![wait(50, Some(4 * BLOCK), 0)]])));
    let work_only = run(&kernel(compute(10, 24)));
    let (c, w) = (copy_only.latency_ms, work_only.latency_ms);
    assert!(c > 0.2 * w && w > 0.2 * c, "the test needs comparable parts: copy {c} ms, work {w} ms");
    // Overlapped: about the larger part; serial: about their sum.
    assert!(overlapped.latency_ms < 1.05 * c.max(w), "overlapped {} vs copy {c}, work {w}", overlapped.latency_ms);
    assert!(serial.latency_ms > 0.95 * (c + w), "serial {} vs copy {c} + work {w}", serial.latency_ms);
    // Every copy is HBM traffic, whatever the order.
    assert_eq!(overlapped.hbm_bytes, 4 * BLOCK);
    assert_eq!(serial.hbm_bytes, 4 * BLOCK);
}

#[test]
fn a_wait_counts_the_bytes_it_waits_for_on_its_semaphore() {
    // One small copy, then a larger one on the same semaphore; the work waits for the small
    // copy's bytes only, then the last wait for the large one.
    let small = BLOCK / 8;
    let body = |first_wait: Option<u64>| {
        kernel(cat(vec![
            vec![start(1, small, 0), start(2, 2 * BLOCK, 0), wait(3, first_wait, 0)],
            compute(10, 24),
            vec![wait(50, Some(2 * BLOCK), 0)],
        ]))
    };
    let counted = run(&body(Some(small)));
    // A wait naming no size waits for every copy on its semaphore: the work waits for both.
    let all = run(&body(None));
    assert!(counted.latency_ms < 0.8 * all.latency_ms, "{} vs {}", counted.latency_ms, all.latency_ms);
    // A copy on another semaphore is not waited for: the work starts after the small copy.
    let other = run(&kernel(cat(vec![
        vec![start(1, small, 0), start(2, 2 * BLOCK, 1), wait(3, None, 0)],
        compute(10, 24),
        vec![wait(50, None, 1)],
    ])));
    assert!((other.latency_ms - counted.latency_ms).abs() < 0.02 * counted.latency_ms, "{} vs {}", other.latency_ms, counted.latency_ms);
}

#[test]
fn a_copy_costs_at_least_its_issue() {
    // 256 empty copies take the DMA engines 256 issues (fitted.dma_issue_ns each), not nothing.
    let chip = ChipModel::preset("v6e").unwrap();
    let body: Vec<Value> = (0..256).map(|i| start(1 + i, 0, 0)).chain([wait(300, None, 0)]).collect();
    let r = run(&kernel(body));
    let issue_ms = 256.0 * chip.fitted.dma_issue_ns.value * 1e-6;
    assert!(r.latency_ms >= issue_ms && r.latency_ms < issue_ms + 0.002, "{} vs {issue_ms}", r.latency_ms);
    assert_eq!(r.hbm_bytes, 0);
}

#[test]
fn semaphore_fields_are_checked() {
    let mut k = kernel(vec![start(1, 64, 0), wait(2, None, 0)]);
    k["body"][0]["attrs"]["sem_ref"] = json!(2);
    let e = tpusim_pallas::Description::from_json(&k.to_string(), "copies.json").unwrap_err().to_string();
    assert!(e.contains("sem_ref") && e.contains("semaphore") && e.contains("scratch 0"), "{e}");
    let mut k = kernel(vec![start(1, 64, 0), wait(2, None, 0)]);
    k["body"][1]["attrs"]["sem_offsets"] = json!([0, 1]);
    let e = tpusim_pallas::Description::from_json(&k.to_string(), "copies.json").unwrap_err().to_string();
    assert!(e.contains("sem_offsets") && e.contains("one index per dimension"), "{e}");
    let mut k = kernel(vec![start(1, 64, 0), wait(2, None, 0)]);
    k["body"][1]["attrs"]["bytes"] = json!("lots");
    let e = tpusim_pallas::Description::from_json(&k.to_string(), "copies.json").unwrap_err().to_string();
    assert!(e.contains("attrs.bytes") && e.contains("k.py:2"), "{e}");
}

#[test]
fn a_wait_for_a_copy_an_earlier_step_started_waits_for_it() {
    // Step 0 starts a 4-block copy; step 1 waits for it, then works on it.
    let cross = run(&kernel_steps(vec![on_step(0, vec![start(1, 4 * BLOCK, 0)]), on_step(1, cat(vec![vec![wait(2, Some(4 * BLOCK), 0)], compute(10, 24)]))], 2));
    // Without the wait the work would start at once.
    let free = run(&kernel_steps(vec![on_step(0, vec![start(1, 4 * BLOCK, 0)]), on_step(1, compute(10, 24))], 2));
    let copy = run(&kernel(vec![start(1, 4 * BLOCK, 0), wait(2, Some(4 * BLOCK), 0)])).latency_ms;
    let work = run(&kernel(compute(10, 24))).latency_ms;
    assert!(cross.latency_ms > free.latency_ms + 0.5 * copy.min(work), "{} vs {}", cross.latency_ms, free.latency_ms);
    assert!(cross.latency_ms > 0.9 * (copy + work), "{} vs copy {copy} + work {work}", cross.latency_ms);
}

#[test]
fn a_copy_waited_for_at_once_takes_issue_latency_and_transfer_whatever_the_slots() {
    // One copy then its wait: issue + latency + transfer, with 64 slots in flight or 1 (the
    // latency is not counted twice when one copy holds the only slot).
    let body = vec![start(1, BLOCK, 0), wait(2, Some(BLOCK), 0)];
    let chip = ChipModel::preset("v6e").unwrap();
    let one = chip.clone().with_override("fitted.dmas_in_flight", "1").unwrap();
    let (a, b) = (run_on(&chip, &kernel(body.clone())).unwrap().latency_ms, run_on(&one, &kernel(body.clone())).unwrap().latency_ms);
    assert!((a - b).abs() < 1e-9, "{a} vs {b}");
    // A longer issue is on the chain of a copy waited for at once.
    let issue = chip.fitted.dma_issue_ns.value;
    let slow = chip.with_override("fitted.dma_issue_ns", "2000").unwrap();
    let c = run_on(&slow, &kernel(body)).unwrap().latency_ms;
    assert!((c - a - (2000.0 - issue) * 1e-6).abs() < 1e-6, "{c} vs {a} (issue {issue} ns)");
}

#[test]
fn semaphore_indices_are_checked_at_the_step() {
    // Index 5 of a 2-semaphore array.
    let e = run_on(&ChipModel::preset("v6e").unwrap(), &kernel(vec![start(1, 64, 5), wait(2, None, 5)])).unwrap_err();
    assert!(e.contains("sem_offsets[0] = 5") && e.contains("scratch 1") && e.contains("k.py:1"), "{e}");
    // No index on an array of semaphores.
    let mut k = kernel(vec![start(1, 64, 0), wait(2, None, 0)]);
    k["body"][1]["attrs"]["sem_offsets"] = json!([]);
    let e = tpusim_pallas::Description::from_json(&k.to_string(), "copies.json").unwrap_err().to_string();
    assert!(e.contains("sem_offsets") && e.contains("one index per dimension"), "{e}");
    // A misspelt attribute is refused, not read as "wait for every copy".
    let mut k = kernel(vec![start(1, 64, 0), wait(2, None, 0)]);
    k["body"][1]["attrs"]["semref"] = json!(3);
    let e = tpusim_pallas::Description::from_json(&k.to_string(), "copies.json").unwrap_err().to_string();
    assert!(e.contains("attrs.semref") && e.contains("sem_ref"), "{e}");
}

/// `n` matmuls of a bf16 scratch block with itself (512 x 512 by 512 x 512 bf16 operands).
fn matmuls(first_id: u64, n: u64) -> Vec<Value> {
    let mut ops = vec![json!({"op": "vector.load", "id": first_id, "operands": [{"ref": 4}, {"scalar": 0}, {"scalar": 0}], "shape": [512, 512], "dtype": "bf16", "loc": "k.py:200"})];
    for k in 1..=n {
        ops.push(json!({"op": "tpu.matmul", "id": first_id + k, "operands": [{"op": first_id}, {"op": first_id}], "shape": [512, 512], "dtype": "f32",
                        "loc": "k.py:201", "attrs": {"mkn": [512, 512, 512], "lhs_dtype": "bf16", "rhs_dtype": "bf16"}}));
    }
    ops
}

#[test]
fn a_wait_at_the_end_of_a_step_holds_the_next_step_back() {
    // Each of 4 steps: 8 matmuls, then a copy out and its wait. The TensorCore issues in order,
    // so a step's matmuls start after the previous step's wait: 4 x (matmuls + copy), not the
    // matmuls back to back with the copies under them.
    let small = BLOCK / 4;
    let tail = || vec![start(1, small, 0), wait(2, Some(small), 0)];
    let waited = run(&kernel_steps(cat(vec![matmuls(10, 8), tail()]), 4)).latency_ms;
    let mm = run(&kernel(matmuls(10, 8))).latency_ms;
    let copy = run(&kernel(tail())).latency_ms;
    assert!(copy > 0.2 * mm, "the test needs a copy comparable to the matmuls: {copy} vs {mm}");
    assert!(waited > 0.95 * 4.0 * (mm + copy), "{waited} vs 4 x ({mm} + {copy})");
    // Without the waits the copies run under the next steps' matmuls.
    let unwaited = run(&kernel_steps(cat(vec![matmuls(10, 8), vec![start(1, small, 0)]]), 4)).latency_ms;
    assert!(unwaited < 0.9 * waited, "{unwaited} vs {waited}");
}
