//! Copies and grids sized at run time on the IR path: a `tpu.enqueue_dma` whose size is an
//! expression over a scalar-prefetch table (what `tpusim.jax.describe` writes for a
//! `pl.ds(start, size)` slice with a traced size) moves exactly the bytes the table gives, never
//! 0; a copy without a size, a negative one, one sized by a runtime table that was not given, a
//! dynamic grid dimension and a loop without its condition are refused naming the kernel, the
//! op or field and its location.

use serde_json::{json, Value};
use tpusim_chip::ChipModel;
use tpusim_job::{DescribedJob, Job, Report};

const ROW_BYTES: i64 = 128 * 4;

/// One grid step per entry of `lens`; step i copies `lens[i]` rows of 128 f32 from HBM with a
/// copy whose size is `bytes` (default: `lens[i]` x 512 bytes, as an expression).
fn kernel(lens: Value, bytes: Option<Value>, grid: Value) -> Value {
    let bytes = bytes.unwrap_or_else(|| json!(["mul", ["load", 0, [["grid", 0]]], ROW_BYTES]));
    json!({
        "format": "tpusim-kernel-description", "version": 1, "kernel_name": "ragged_copy",
        "kernel_metadata": null, "producer": {"tool": "test", "jax": "", "device_kind": "", "mosaic_version": 11},
        "grid": grid, "dimension_semantics": ["arbitrary"], "vmem_limit_bytes": null, "cost_estimate": null,
        "refs": [
            {"name": "prefetch 0", "kind": "prefetch", "shape": [4], "dtype": "i32", "memory_space": "smem", "values": lens},
            {"name": "input 0", "kind": "input", "shape": [1024, 128], "array_shape": [1024, 128], "dtype": "f32", "memory_space": "any"},
            {"name": "scratch 0", "kind": "scratch", "shape": [256, 128], "dtype": "f32", "memory_space": "vmem"}
        ],
        "body": [{"op": "tpu.enqueue_dma", "id": 1, "loc": "ragged.py:8",
                  "attrs": {"bytes": bytes, "src_ref": 1,
                            "src_offsets": [["mul", ["grid", 0], 256], 0],
                            "src_shape": [["load", 0, [["grid", 0]]], 128]}}]
    })
}

fn read(v: &Value) -> Result<tpusim_pallas::Description, String> {
    tpusim_pallas::Description::from_json(&v.to_string(), "ragged.json").map_err(|e| e.to_string())
}

fn run(v: &Value) -> Result<Report, String> {
    let d = read(v)?;
    let chip = ChipModel::preset("v6e").expect("preset");
    let job = Job::Described(DescribedJob::new("ragged.json", d, "."));
    tpusim_job::run(&chip, &job).map(|r| Report::from_run(&r)).map_err(|e| e.to_string())
}

#[test]
fn a_copy_sized_at_run_time_moves_the_bytes_its_table_gives() {
    let lens = [256i64, 128, 64, 200];
    let r = run(&kernel(json!({"inline": lens}), None, json!([4]))).expect("simulates");
    let copied: i64 = lens.iter().sum::<i64>() * ROW_BYTES;
    // The output-free kernel's HBM traffic is its copies (no windows).
    assert_eq!(r.hbm_bytes, copied as u64, "{r:?}");
    // Twice the rows, twice the bytes: the size follows the table, not a constant.
    let doubled = lens.map(|l| l.min(128) * 2);
    let r2 = run(&kernel(json!({"inline": doubled}), None, json!([4]))).expect("simulates");
    assert_eq!(r2.hbm_bytes, (doubled.iter().sum::<i64>() * ROW_BYTES) as u64);
}

#[test]
fn a_copy_without_a_size_is_refused_naming_it() {
    let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4]));
    k["body"][0]["attrs"].as_object_mut().unwrap().remove("bytes");
    let e = read(&k).unwrap_err();
    assert!(e.contains("tpu.enqueue_dma") && e.contains("ragged.py:8") && e.contains("attrs.bytes") && e.contains("(missing)"), "{e}");
}

#[test]
fn a_negative_size_is_refused_naming_the_field() {
    // What a dynamic dimension read as a number gives (MLIR's marker times the element bytes).
    let e = read(&kernel(json!({"inline": [1, 1, 1, 1]}), Some(json!(i64::MIN)), json!([4]))).unwrap_err();
    assert!(e.contains("attrs.bytes") && e.contains(&i64::MIN.to_string()) && e.contains("run time"), "{e}");
    // A size negative in a step is refused when that step runs, for the window and the bytes.
    let e = run(&kernel(json!({"inline": [1, -3, 1, 1]}), None, json!([4]))).unwrap_err();
    assert!(e.contains("ragged_copy") && e.contains("ragged.py:8") && e.contains("[-3, 128]") && e.contains("0 or more"), "{e}");
    let mut k = kernel(json!({"inline": [1, -3, 1, 1]}), None, json!([4]));
    k["body"][0]["attrs"].as_object_mut().unwrap().retain(|key, _| key == "bytes");
    let e = run(&k).unwrap_err();
    assert!(e.contains("-1536 bytes") && e.contains("0 or more") && !e.contains("Bin("), "{e}");
}

#[test]
fn bytes_disagreeing_with_the_window_or_overflowing_are_refused() {
    // 4 bytes beside a window of lens[i] rows of 512 bytes.
    let e = run(&kernel(json!({"inline": [1, 1, 1, 1]}), Some(json!(4)), json!([4]))).unwrap_err();
    assert!(e.contains("copies 4 bytes") && e.contains("512 bytes") && e.contains("src_shape"), "{e}");
    // 64-bit overflow is an error, never a wrapped size.
    let e = run(&kernel(json!({"inline": [1, 1, 1, 1]}), Some(json!(["mul", 1i64 << 62, 4])), json!([4]))).unwrap_err();
    assert!(e.contains("overflows"), "{e}");
    let e = run(&kernel(json!({"inline": [1, 1, 1, 1]}), Some(json!(["shl", 1, 64])), json!([4]))).unwrap_err();
    assert!(e.contains("overflows"), "{e}");
}

#[test]
fn a_copy_source_must_name_a_ref_and_one_size_per_dimension() {
    let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4]));
    k["body"][0]["attrs"]["src_ref"] = json!(99);
    let e = read(&k).unwrap_err();
    assert!(e.contains("attrs.src_ref") && e.contains("99") && e.contains("ragged.py:8"), "{e}");
    let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4]));
    k["body"][0]["attrs"]["src_shape"] = json!([128]);
    let e = read(&k).unwrap_err();
    assert!(e.contains("attrs.src_shape") && e.contains("one expression per dimension"), "{e}");
    let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4]));
    k["body"][0]["attrs"]["src_shape"] = json!([["load", 9, [0]], 128]);
    let e = read(&k).unwrap_err();
    assert!(e.contains("attrs.src_shape") && e.contains("ref 9"), "{e}");
    let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4]));
    k["body"][0]["attrs"].as_object_mut().unwrap().remove("src_offsets");
    let e = read(&k).unwrap_err();
    assert!(e.contains("attrs.src_offsets") && e.contains("(missing)"), "{e}");
}

#[test]
fn grids_too_large_to_walk_are_refused_not_wrapped() {
    for grid in [json!([1u64 << 31, 1u64 << 31, 4]), json!([1u64 << 40, 1u64 << 40, 4]), json!([i64::MAX, 4])] {
        let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, grid.clone());
        k["dimension_semantics"] = json!(vec!["arbitrary"; grid.as_array().unwrap().len()]);
        let e = read(&k).unwrap_err();
        assert!(e.contains("grid") && e.contains("at most 4294967296 grid steps"), "{grid}: {e}");
    }
}

#[test]
fn loops_over_the_whole_i64_range_count_without_overflow() {
    let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4]));
    let dma = k["body"][0].clone();
    // -2^63, -2^62, 0, 2^62: four iterations (the span overflows 64 bits; this used to hang).
    k["body"] = json!([{"op": "scf.for", "id": 7, "loc": "ragged.py:20", "lower": i64::MIN, "upper": i64::MAX, "step": 1i64 << 62, "then": [dma.clone()]}]);
    assert_eq!(run(&k).expect("four iterations a step").hbm_bytes, 4 * 4 * ROW_BYTES as u64);
    // Step 1: 2^64 - 1 iterations, past the unroll limit.
    k["body"] = json!([{"op": "scf.for", "id": 7, "loc": "ragged.py:20", "lower": i64::MIN, "upper": i64::MAX, "step": 1, "then": [dma]}]);
    let e = run(&k).unwrap_err();
    assert!(e.contains("ragged.py:20") && e.contains("iterations per step"), "{e}");
}

#[test]
fn a_size_read_from_a_table_not_given_names_the_operand() {
    let e = run(&kernel(json!({"runtime": "lens"}), None, json!([4]))).unwrap_err();
    assert!(e.contains("lens") && e.contains("--runtime lens=") && e.contains("ragged.py:8"), "{e}");
}

#[test]
fn a_dynamic_grid_dimension_is_refused_by_name() {
    let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4, i64::MIN]));
    k["dimension_semantics"] = json!(["arbitrary", "arbitrary"]);
    let e = read(&k).unwrap_err();
    assert!(e.contains("grid[1]") && e.contains("ragged_copy") && e.contains("sized at run time") && !e.contains("expected u64"), "{e}");
}

#[test]
fn a_while_loop_without_its_condition_names_kernel_op_and_line() {
    let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4]));
    k["body"] = json!([{"op": "scf.while", "id": 5, "loc": "ragged.py:12", "then": [], "else": [],
                        "attrs": {"carried": [], "init": [], "forward": [], "args": [], "yield": [], "results": []}}]);
    let e = read(&k).unwrap_err();
    assert!(e.contains("ragged_copy") && e.contains("scf.while") && e.contains("ragged.py:12") && e.contains("cond"), "{e}");
}

/// A kernel that keeps a flag in SMEM scratch: each step reads it (Pallas reads the old value
/// before a store), stores lens[i], reads it back and copies when it is set.
fn smem_flag(read_before_store_decides: bool) -> Value {
    let mut k = kernel(json!({"inline": [2, 0, 3, 0]}), None, json!([4]));
    k["refs"].as_array_mut().unwrap().push(json!({"name": "scratch 1", "kind": "scratch", "shape": [4], "dtype": "i32", "memory_space": "smem"}));
    let dma = k["body"][0].clone();
    let cond = if read_before_store_decides { json!(["var", 10]) } else { json!(["var", 12]) };
    k["body"] = json!([
        {"op": "memref.load", "id": 10, "operands": [{"ref": 3}], "attrs": {"index": [1]}, "loc": "flag.py:3"},
        {"op": "memref.store", "id": 11, "operands": [{"ref": 3}], "attrs": {"value": ["load", 0, [["grid", 0]]], "index": [1]}, "loc": "flag.py:4"},
        {"op": "memref.load", "id": 12, "operands": [{"ref": 3}], "attrs": {"index": [1]}, "loc": "flag.py:5"},
        {"op": "scf.if", "id": 13, "cond": cond, "then": [dma], "else": [], "loc": "flag.py:6"}
    ]);
    k
}

#[test]
fn smem_scratch_is_written_before_it_is_read_and_an_unwritten_read_is_named() {
    // Steps 0 and 2 have a nonzero flag: they copy 2 and 3 rows.
    let r = run(&smem_flag(false)).expect("simulates");
    assert_eq!(r.hbm_bytes, 5 * ROW_BYTES as u64);
    // Deciding on the value read before the first store is an error naming it.
    let e = run(&smem_flag(true)).unwrap_err();
    assert!(e.contains("scratch 1") && e.contains("before the kernel writes it") && e.contains("flag.py:6"), "{e}");
}

#[test]
fn negative_or_fractional_sizes_name_their_field() {
    for (path, value, field) in [
        (&["vmem_limit_bytes"][..], json!(-1), "vmem_limit_bytes"),
        (&["refs", "1", "array_shape"][..], json!([-1024, 128]), "refs[1].array_shape[0]"),
        (&["refs", "2", "shape"][..], json!([256, 1.5]), "refs[2].shape[1]"),
        (&["grid"][..], json!([2.0]), "grid[0]"),
    ] {
        let mut k = kernel(json!({"inline": [1, 1, 1, 1]}), None, json!([4]));
        let mut at = &mut k;
        for p in &path[..path.len() - 1] {
            at = match p.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*p],
            };
        }
        at[path[path.len() - 1]] = value.clone();
        let e = read(&k).unwrap_err();
        assert!(e.contains(field) && !e.contains("expected u64"), "{field}: {e}");
    }
}

#[test]
fn a_var_naming_no_value_of_the_body_is_refused_when_read() {
    let mut k = smem_flag(false);
    k["body"][3]["cond"] = json!(["var", 999]);
    let e = read(&k).unwrap_err();
    assert!(e.contains("[\"var\", 999]") && e.contains("cond") && e.contains("scf.if"), "{e}");
}
