//! Scalar expressions over grid indices, loop indices and prefetch values: index maps, branch
//! conditions and loop bounds. Written in the file as JSON: an integer, or an array whose first
//! element names the operation (`["grid", 1]`, `["add", a, b]`, `["load", 0, [i, j]]`;
//! DESCRIPTION.md lists them). Evaluated in 64-bit integers; booleans are 0 / 1.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A binary operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a x b
    Mul,
    /// Division truncating toward zero (`arith.divsi`).
    Div,
    /// Division rounding down (`arith.floordivsi`).
    FloorDiv,
    /// Division rounding up (`arith.ceildivsi`).
    CeilDiv,
    /// Remainder with the dividend's sign (`arith.remsi`).
    Rem,
    /// min(a, b)
    Min,
    /// max(a, b)
    Max,
    /// a == b
    Eq,
    /// a != b
    Ne,
    /// a < b
    Lt,
    /// a <= b
    Le,
    /// a > b
    Gt,
    /// a >= b
    Ge,
    /// Bitwise and (logical and of booleans).
    And,
    /// Bitwise or.
    Or,
    /// Bitwise xor.
    Xor,
    /// a << b
    Shl,
    /// a >> b (arithmetic)
    Shr,
}

const BINOPS: [(&str, BinOp); 20] = [
    ("add", BinOp::Add),
    ("sub", BinOp::Sub),
    ("mul", BinOp::Mul),
    ("div", BinOp::Div),
    ("floordiv", BinOp::FloorDiv),
    ("ceildiv", BinOp::CeilDiv),
    ("rem", BinOp::Rem),
    ("min", BinOp::Min),
    ("max", BinOp::Max),
    ("eq", BinOp::Eq),
    ("ne", BinOp::Ne),
    ("lt", BinOp::Lt),
    ("le", BinOp::Le),
    ("gt", BinOp::Gt),
    ("ge", BinOp::Ge),
    ("and", BinOp::And),
    ("or", BinOp::Or),
    ("xor", BinOp::Xor),
    ("shl", BinOp::Shl),
    ("shr", BinOp::Shr),
];

/// A scalar expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A constant.
    Const(i64),
    /// Grid index of dimension `d` (`program_id(d)`).
    Grid(usize),
    /// Induction variable of the enclosing `scf.for` at nesting depth `d` (0 = outermost).
    Iv(usize),
    /// An element of table `r` (index into the description's refs: a prefetch ref, or an SMEM
    /// input whose values the description holds) at the indices.
    Load(usize, Vec<Expr>),
    /// A binary operation.
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// `c ? a : b`.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// The value an SMEM load op (`memref.load` of a ref the kernel also stores to) bound when
    /// it ran, by the op's id (`["var", id]`): loads of mutable SMEM are read in program order.
    Var(u64),
    /// A value the IR computes from something not known before the run: the reason names it.
    Unknown(String),
}

/// Why an expression could not be evaluated.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalError {
    /// It reads a value not known before the run (the reason from the file).
    Unknown(String),
    /// It reads a table whose values are a runtime input, or a ref whose values the
    /// description does not hold (the ref's index).
    Runtime(usize),
    /// An index is out of a table's bounds (ref, indices).
    OutOfBounds(usize, Vec<i64>),
    /// Division by zero, or an undefined induction variable.
    Invalid(String),
}

/// What evaluation reads: grid indices, loop induction variables, prefetch tables.
pub trait Env {
    /// Grid index `d`.
    fn grid(&self, d: usize) -> i64;
    /// Induction variable at depth `d`, if inside such a loop.
    fn iv(&self, d: usize) -> Option<i64>;
    /// Element of prefetch ref `r`.
    fn load(&self, r: usize, idx: &[i64]) -> Result<i64, EvalError>;
    /// The value bound by the SMEM load op `id` in this step, if it ran.
    fn var(&self, _id: u64) -> Option<i64> {
        None
    }
    /// Why the SMEM load op `id` bound no value though it ran (it read scratch not yet written).
    fn unbound(&self, _id: u64) -> Option<String> {
        None
    }
}

impl Expr {
    /// Evaluates the expression.
    ///
    /// # Errors
    /// [`EvalError`] when it reads an unknown value, a runtime table, an index out of bounds,
    /// or divides by zero.
    #[inline]
    pub fn eval<E: Env + ?Sized>(&self, env: &E) -> Result<i64, EvalError> {
        // Constants and grid indices - most of an index map's nodes - without a call.
        match self {
            Expr::Const(c) => Ok(*c),
            Expr::Grid(d) => Ok(env.grid(*d)),
            _ => self.eval_node(env),
        }
    }

    /// [`Expr::eval`] of an inner node.
    fn eval_node<E: Env + ?Sized>(&self, env: &E) -> Result<i64, EvalError> {
        Ok(match self {
            Expr::Const(c) => *c,
            Expr::Grid(d) => env.grid(*d),
            Expr::Iv(d) => env.iv(*d).ok_or_else(|| EvalError::Invalid(format!("loop index {d} outside its loop")))?,
            Expr::Load(r, idx) => Self::eval_load(*r, idx, env)?,
            Expr::Select(c, a, b) => {
                if c.eval(env)? != 0 {
                    a.eval(env)?
                } else {
                    b.eval(env)?
                }
            }
            Expr::Var(id) => env.var(*id).ok_or_else(|| match env.unbound(*id) {
                Some(why) => EvalError::Unknown(why),
                None => EvalError::Invalid(format!("the SMEM load {id} is read before it runs")),
            })?,
            Expr::Unknown(why) => return Err(EvalError::Unknown(why.clone())),
            Expr::Bin(op, a, b) => {
                let (x, y) = (a.eval(env)?, b.eval(env)?);
                let nz = |y: i64| if y == 0 { Err(EvalError::Invalid("division by zero".into())) } else { Ok(y) };
                // 64-bit index arithmetic: a result outside i64 is an error, never a wrapped value.
                let ov = |r: Option<i64>| r.ok_or_else(|| EvalError::Invalid(format!("{op:?} of {x} and {y} overflows 64-bit integers")));
                match op {
                    BinOp::Add => ov(x.checked_add(y))?,
                    BinOp::Sub => ov(x.checked_sub(y))?,
                    BinOp::Mul => ov(x.checked_mul(y))?,
                    BinOp::Div => ov(x.checked_div(nz(y)?))?,
                    BinOp::FloorDiv => ov(x.checked_div_euclid(nz(y)?))? - i64::from(y < 0 && x.rem_euclid(y) != 0),
                    BinOp::CeilDiv => {
                        let y = nz(y)?;
                        let q = ov(x.checked_div(y))?;
                        if (x % y != 0) && ((x < 0) == (y < 0)) {
                            q + 1
                        } else {
                            q
                        }
                    }
                    BinOp::Rem => ov(x.checked_rem(nz(y)?))?,
                    BinOp::Min => x.min(y),
                    BinOp::Max => x.max(y),
                    BinOp::Eq => i64::from(x == y),
                    BinOp::Ne => i64::from(x != y),
                    BinOp::Lt => i64::from(x < y),
                    BinOp::Le => i64::from(x <= y),
                    BinOp::Gt => i64::from(x > y),
                    BinOp::Ge => i64::from(x >= y),
                    BinOp::And => x & y,
                    BinOp::Or => x | y,
                    BinOp::Xor => x ^ y,
                    BinOp::Shl => ov(u32::try_from(y).ok().filter(|&k| k < 64).and_then(|k| x.checked_shl(k)).filter(|r| r >> y == x))?,
                    BinOp::Shr => ov(u32::try_from(y).ok().filter(|&k| k < 64).map(|k| x >> k))?,
                }
            }
        })
    }

    /// A prefetch load: its indices on the stack when there are at most 8 (loads run per grid
    /// step).
    #[inline(never)]
    fn eval_load<E: Env + ?Sized>(r: usize, idx: &[Expr], env: &E) -> Result<i64, EvalError> {
        if idx.len() <= 8 {
            let mut v = [0i64; 8];
            for (slot, e) in v.iter_mut().zip(idx) {
                *slot = e.eval(env)?;
            }
            env.load(r, &v[..idx.len()])
        } else {
            let v: Vec<i64> = idx.iter().map(|e| e.eval(env)).collect::<Result<_, _>>()?;
            env.load(r, &v)
        }
    }

    /// Whether the expression reads a loop induction variable.
    pub fn uses_iv(&self) -> bool {
        match self {
            Expr::Iv(_) => true,
            Expr::Load(_, i) => i.iter().any(Expr::uses_iv),
            Expr::Bin(_, a, b) => a.uses_iv() || b.uses_iv(),
            Expr::Select(c, a, b) => c.uses_iv() || a.uses_iv() || b.uses_iv(),
            _ => false,
        }
    }

    fn from_value(v: &Value) -> Result<Expr, String> {
        match v {
            Value::Number(n) => n.as_i64().map(Expr::Const).ok_or_else(|| format!("{n}: expected an integer")),
            Value::Bool(b) => Ok(Expr::Const(i64::from(*b))),
            Value::Array(a) => {
                let head = a.first().and_then(Value::as_str).ok_or_else(|| format!("{v}: expected [\"op\", ...]"))?;
                let args = &a[1..];
                let want = |n: usize| {
                    if args.len() == n {
                        Ok(())
                    } else {
                        Err(format!("{v}: `{head}` takes {n} arguments"))
                    }
                };
                let idx = |x: &Value| x.as_u64().map(|u| u as usize).ok_or_else(|| format!("{v}: expected a whole number after `{head}`"));
                match head {
                    "grid" => {
                        want(1)?;
                        Ok(Expr::Grid(idx(&args[0])?))
                    }
                    "iv" => {
                        want(1)?;
                        Ok(Expr::Iv(idx(&args[0])?))
                    }
                    "load" => {
                        want(2)?;
                        let r = idx(&args[0])?;
                        let list = args[1].as_array().ok_or_else(|| format!("{v}: `load` takes a ref and a list of indices"))?;
                        Ok(Expr::Load(r, list.iter().map(Expr::from_value).collect::<Result<_, _>>()?))
                    }
                    "var" => {
                        want(1)?;
                        Ok(Expr::Var(args[0].as_u64().ok_or_else(|| format!("{v}: expected an op id after `var`"))?))
                    }
                    "select" => {
                        want(3)?;
                        Ok(Expr::Select(
                            Box::new(Expr::from_value(&args[0])?),
                            Box::new(Expr::from_value(&args[1])?),
                            Box::new(Expr::from_value(&args[2])?),
                        ))
                    }
                    "not" => {
                        want(1)?;
                        Ok(Expr::Bin(BinOp::Eq, Box::new(Expr::from_value(&args[0])?), Box::new(Expr::Const(0))))
                    }
                    "unknown" => {
                        want(1)?;
                        Ok(Expr::Unknown(args[0].as_str().unwrap_or("a runtime value").to_string()))
                    }
                    name => {
                        let op = BINOPS
                            .iter()
                            .find(|(n, _)| *n == name)
                            .map(|(_, o)| *o)
                            .ok_or_else(|| format!("{v}: unknown expression `{name}` (expected grid, iv, load, select, not, unknown or one of {})", BINOPS.map(|b| b.0).join(", ")))?;
                        want(2)?;
                        Ok(Expr::Bin(op, Box::new(Expr::from_value(&args[0])?), Box::new(Expr::from_value(&args[1])?)))
                    }
                }
            }
            _ => Err(format!("{v}: expected an integer or [\"op\", ...]")),
        }
    }

    fn to_value(&self) -> Value {
        match self {
            Expr::Const(c) => Value::from(*c),
            Expr::Grid(d) => Value::from(vec![Value::from("grid"), Value::from(*d)]),
            Expr::Iv(d) => Value::from(vec![Value::from("iv"), Value::from(*d)]),
            Expr::Load(r, i) => Value::from(vec![Value::from("load"), Value::from(*r), Value::from(i.iter().map(Expr::to_value).collect::<Vec<_>>())]),
            Expr::Select(c, a, b) => Value::from(vec![Value::from("select"), c.to_value(), a.to_value(), b.to_value()]),
            Expr::Unknown(w) => Value::from(vec![Value::from("unknown"), Value::from(w.clone())]),
            Expr::Var(id) => Value::from(vec![Value::from("var"), Value::from(*id)]),
            Expr::Bin(op, a, b) => {
                let name = BINOPS.iter().find(|(_, o)| o == op).map(|(n, _)| *n).unwrap_or("add");
                Value::from(vec![Value::from(name), a.to_value(), b.to_value()])
            }
        }
    }
}

impl Serialize for Expr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Expr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Expr::from_value(&v).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct E;
    impl Env for E {
        fn grid(&self, d: usize) -> i64 {
            [3, 5][d]
        }
        fn iv(&self, _: usize) -> Option<i64> {
            Some(2)
        }
        fn load(&self, _: usize, idx: &[i64]) -> Result<i64, EvalError> {
            Ok(idx[0] * 10)
        }
    }

    #[test]
    fn parses_and_evaluates() {
        let e: Expr = serde_json::from_str(r#"["add", ["mul", ["grid", 0], 4], ["load", 2, [["grid", 1]]]]"#).unwrap();
        assert_eq!(e.eval(&E).unwrap(), 3 * 4 + 50);
        let back = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<Expr>(&back).unwrap(), e);
        let f: Expr = serde_json::from_str(r#"["floordiv", -7, 2]"#).unwrap();
        assert_eq!(f.eval(&E).unwrap(), -4);
        let c: Expr = serde_json::from_str(r#"["ceildiv", 7, 2]"#).unwrap();
        assert_eq!(c.eval(&E).unwrap(), 4);
        let err = serde_json::from_str::<Expr>(r#"["pow", 1, 2]"#).unwrap_err().to_string();
        assert!(err.contains("unknown expression `pow`"), "{err}");
        let u: Expr = serde_json::from_str(r#"["unknown", "memref.load of scratch ref 3"]"#).unwrap();
        assert!(matches!(u.eval(&E), Err(EvalError::Unknown(_))));
    }
}
