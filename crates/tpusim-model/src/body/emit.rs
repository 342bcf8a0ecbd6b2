//! Writing a body as the op sequence a kernel runs: the hand-written kernels of this crate emit
//! their step bodies through [`Emitter`], op by op as their Mosaic IR has them, into the same
//! [`Builder`] a kernel read from its IR goes through, so both front ends build one body from
//! one op list (the agreement suite compares the bodies' signatures).

use super::{Arg, Attrs, BodyOp, Builder, Built};

/// A value an [`Emitter`] produced: its op's id, shape and element type.
#[derive(Debug, Clone, PartialEq)]
pub struct V {
    /// The op's id.
    pub id: u64,
    /// Its result shape.
    pub shape: Vec<u64>,
    /// Its element type.
    pub dtype: &'static str,
}

/// Emits ops into a [`Builder`] (module docs). Every op the emitter writes is
/// in the cost table; an op the builder refused would be a bug in a hand-written kernel, so it
/// panics with the op (not input-dependent). A clone continues independently ([`Builder`]).
#[derive(Debug, Clone)]
pub struct Emitter {
    b: Builder,
    /// The op being emitted (one value reused: its buffers are not reallocated per op).
    op: BodyOp,
    next: u64,
}

impl Emitter {
    /// An emitter for a body whose refs `carried` (by ref index) are loaded and stored by it.
    pub fn new(carried: Vec<bool>) -> Self {
        Emitter { b: Builder::new(carried), op: BodyOp::default(), next: 1 }
    }

    /// Emits one op and returns its value.
    pub fn op(&mut self, name: &str, shape: &[u64], dtype: &'static str, args: Vec<Arg>, attrs: Attrs) -> V {
        let id = self.next;
        self.next += 1;
        let op = &mut self.op;
        op.id = id;
        op.name.clear();
        op.name.push_str(name);
        op.shape.clear();
        op.shape.extend_from_slice(shape);
        op.dtype.clear();
        op.dtype.push_str(dtype);
        op.args = args;
        op.attrs = attrs;
        if let Err(e) = self.b.op(op) {
            panic!("a hand-written kernel emitted `{name}` {shape:?}: {e}");
        }
        V { id, shape: shape.to_vec(), dtype }
    }

    /// `vector.load` of ref `r` as `shape`.
    pub fn load(&mut self, r: usize, shape: &[u64], dtype: &'static str) -> V {
        self.op("vector.load", shape, dtype, vec![Arg::Ref(r), Arg::Scalar, Arg::Scalar], Attrs::default())
    }

    /// `tpu.vector_store` of `v` into ref `r`.
    pub fn store(&mut self, v: &V, r: usize) {
        self.op("tpu.vector_store", &[], "", vec![Arg::Op(v.id), Arg::Ref(r), Arg::Scalar, Arg::Scalar], Attrs::default());
    }

    /// `vector.broadcast` of a scalar (a constant) to `shape`.
    pub fn splat(&mut self, shape: &[u64], dtype: &'static str) -> V {
        self.op("vector.broadcast", shape, dtype, vec![Arg::Scalar], Attrs::default())
    }

    /// `arith.constant` of `shape` (a matmul's zero accumulator, a reduction's initial value).
    pub fn constant(&mut self, shape: &[u64], dtype: &'static str) -> V {
        self.op("arith.constant", shape, dtype, Vec::new(), Attrs::default())
    }

    /// `vector.broadcast` of `v` to `shape`.
    pub fn broadcast(&mut self, v: &V, shape: &[u64]) -> V {
        self.op("vector.broadcast", shape, v.dtype, vec![Arg::Op(v.id)], Attrs::default())
    }

    /// `vector.shape_cast` of `v` to `shape`.
    pub fn shape_cast(&mut self, v: &V, shape: &[u64]) -> V {
        self.op("vector.shape_cast", shape, v.dtype, vec![Arg::Op(v.id)], Attrs::default())
    }

    /// `tpu.iota` of `shape` counting along `dims`.
    pub fn iota(&mut self, shape: &[u64], dims: &[u64]) -> V {
        self.op("tpu.iota", shape, "i32", Vec::new(), Attrs { dims: dims.to_vec(), ..Attrs::default() })
    }

    /// An element-wise op of `args` with the first's shape and element type `dtype`.
    pub fn ew(&mut self, name: &str, args: &[&V], dtype: &'static str) -> V {
        let shape = args.first().map(|a| a.shape.clone()).unwrap_or_default();
        self.op(name, &shape, dtype, args.iter().map(|a| Arg::Op(a.id)).collect(), Attrs::default())
    }

    /// An element-wise op of `args` keeping the first's element type.
    pub fn same(&mut self, name: &str, args: &[&V]) -> V {
        let dtype = args.first().map_or("f32", |a| a.dtype);
        self.ew(name, args, dtype)
    }

    /// `tpu.concatenate` of `n` copies of `v` along `dim`.
    pub fn tile(&mut self, v: &V, n: usize, dim: usize) -> V {
        let mut shape = v.shape.clone();
        shape[dim] *= n as u64;
        self.op("tpu.concatenate", &shape, v.dtype, vec![Arg::Op(v.id); n], Attrs { dimension: Some(dim as u64), ..Attrs::default() })
    }

    /// `vector.multi_reduction` of `v` over `dims` with its initial value `init` (an
    /// `arith.constant` of the result's shape).
    pub fn reduce(&mut self, v: &V, dims: &[u64]) -> V {
        let shape: Vec<u64> = v.shape.iter().enumerate().filter(|(i, _)| !dims.contains(&(*i as u64))).map(|(_, &d)| d).collect();
        let init = self.constant(&shape, v.dtype);
        self.op("vector.multi_reduction", &shape, v.dtype, vec![Arg::Op(v.id), Arg::Op(init.id)], Attrs { dims: dims.to_vec(), ..Attrs::default() })
    }

    /// `tpu.matmul` of `lhs` (m x k) by `rhs` into `acc` (m x n, an f32 zero constant
    /// usually): result m x n f32.
    pub fn matmul(&mut self, lhs: &V, rhs: &V, acc: &V, mkn: [u64; 3]) -> V {
        let attrs = Attrs { mkn: Some(mkn), lhs_dtype: Some(lhs.dtype.to_string()), rhs_dtype: Some(rhs.dtype.to_string()), ..Attrs::default() };
        self.op("tpu.matmul", &[mkn[0], mkn[2]], "f32", vec![Arg::Op(lhs.id), Arg::Op(rhs.id), Arg::Op(acc.id)], attrs)
    }

    /// After one iteration of a rolled loop whose ops span `slabs` slabs ([`Builder::advance`]).
    pub fn advance(&mut self, slabs: usize) {
        self.b.advance(slabs);
    }

    /// The built body.
    pub fn finish(self) -> Built {
        self.b.finish()
    }

    /// The body built so far, with the emitter kept to emit more ops ([`Builder::finish_copy`]).
    pub fn finish_copy(&self) -> Built {
        self.b.finish_copy()
    }
}
