//! The rule of each job field's value, stated once for every front end that is not the command
//! line's parser: trace files, sweep files and the Python package check a value against
//! [`rule`] before they build a [`JobSpec`], so that a bad value is named as
//! `` `heads` = -1: expected a whole number from 1 to 1048576 `` (the field in backticks, rendered
//! by each front end as its user wrote it) instead of a deserialiser's "expected u64". The command
//! line's value parsers state the same ranges (tested below), so every front end refuses the same
//! values with the same words.

use crate::spec::JobSpec;
use tpusim_kernel::{Direction, Exp, InputLayout, Kernel, MaskSource, Masking, Scope, Traversal};
use tpusim_workload::{MAX_DIM, MAX_HEADS, MAX_HEAD_DIM};

/// What a job field takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// A whole number from `lo` to `hi`.
    Whole {
        /// Smallest allowed value.
        lo: u64,
        /// Largest allowed value.
        hi: u64,
    },
    /// One of an option enum's words (`traversal`: full-grid or compact).
    Word(WordField),
    /// true or false.
    Bool,
    /// A number above 0 (MiB; its upper bound is the chip's, checked when the job is built).
    Mib,
    /// Text (a chip name or path, a mask).
    Text,
    /// A list of `SECTION.FIELD=VALUE` texts (`set`).
    TextList,
    /// The path of a kernel description file (`kernel_ir`).
    File,
    /// A list of `NAME=FILE.npy` texts (`runtime`).
    RuntimeList,
}

/// The option-word fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordField {
    /// `kernel`.
    Kernel,
    /// `direction`.
    Direction,
    /// `scope`.
    Scope,
    /// `traversal`.
    Traversal,
    /// `masking`.
    Masking,
    /// `mask_source`.
    MaskSource,
    /// `exp`.
    Exp,
    /// `input_layout`.
    InputLayout,
}

impl WordField {
    /// The allowed words as "a, b or c".
    pub fn allowed(self) -> String {
        match self {
            WordField::Kernel => Kernel::allowed(),
            WordField::Direction => Direction::allowed(),
            WordField::Scope => Scope::allowed(),
            WordField::Traversal => Traversal::allowed(),
            WordField::Masking => Masking::allowed(),
            WordField::MaskSource => MaskSource::allowed(),
            WordField::Exp => Exp::allowed(),
            WordField::InputLayout => InputLayout::allowed(),
        }
    }

    /// Whether `word` is one of them.
    pub fn accepts(self, word: &str) -> bool {
        match self {
            WordField::Kernel => word.parse::<Kernel>().is_ok(),
            WordField::Direction => word.parse::<Direction>().is_ok(),
            WordField::Scope => word.parse::<Scope>().is_ok(),
            WordField::Traversal => word.parse::<Traversal>().is_ok(),
            WordField::Masking => word.parse::<Masking>().is_ok(),
            WordField::MaskSource => word.parse::<MaskSource>().is_ok(),
            WordField::Exp => word.parse::<Exp>().is_ok(),
            WordField::InputLayout => word.parse::<InputLayout>().is_ok(),
        }
    }
}

/// The text after `` `field` = VALUE: `` in an error about a value the rule refuses.
pub const MIB_ALLOWED: &str = "expected a number above 0 and at most the chip's physical VMEM";

impl Rule {
    /// What the rule allows, as an error message states it after the value
    /// (`expected a whole number from 1 to 1048576`).
    pub fn allowed(&self) -> String {
        match self {
            Rule::Whole { lo, hi } => whole_allowed(*lo, *hi),
            Rule::Word(w) => format!("expected {}", w.allowed()),
            Rule::Bool => "expected true or false".into(),
            Rule::Mib => MIB_ALLOWED.into(),
            Rule::Text => "expected text".into(),
            Rule::TextList => "expected a list of SECTION.FIELD=VALUE texts, e.g. [\"hbm.bandwidth_gb_per_s=3276\"]".into(),
            Rule::File => "expected the path of a kernel description file (text)".into(),
            Rule::RuntimeList => "expected a list of NAME=FILE.npy texts, e.g. [\"lengths=lengths.npy\"]".into(),
        }
    }

    /// Whether a whole number (of any sign) passes the rule.
    pub fn accepts_whole(&self, v: i128) -> bool {
        match self {
            Rule::Whole { lo, hi } => v >= i128::from(*lo) && v <= i128::from(*hi),
            Rule::Mib => v > 0,
            _ => false,
        }
    }
}

/// The message of a whole-number rule, shared with the command line's value parsers.
pub fn whole_allowed(lo: u64, hi: u64) -> String {
    format!("expected a whole number from {lo} to {hi}")
}

/// The rule of a job field ([`JobSpec::fields`]); `None` for a name that is not a field.
pub fn rule(field: &str) -> Option<Rule> {
    let whole = |hi| Some(Rule::Whole { lo: 1, hi });
    match field {
        "heads" | "kv_heads" => whole(MAX_HEADS),
        "head_dim" | "head_dim_v" => whole(MAX_HEAD_DIM),
        "batch" | "seq_len" | "q_len" | "kv_len" | "block_q" | "block_kv" | "block_kv_compute" | "block_q_dkv" | "block_kv_dkv"
        | "block_kv_dkv_compute" | "block_q_dq" | "block_kv_dq" | "m" | "n" | "k" | "block_m" | "block_n" | "block_k" => whole(MAX_DIM),
        "kernel" => Some(Rule::Word(WordField::Kernel)),
        "direction" => Some(Rule::Word(WordField::Direction)),
        "scope" => Some(Rule::Word(WordField::Scope)),
        "traversal" => Some(Rule::Word(WordField::Traversal)),
        "masking" => Some(Rule::Word(WordField::Masking)),
        "mask_source" => Some(Rule::Word(WordField::MaskSource)),
        "exp" => Some(Rule::Word(WordField::Exp)),
        "input_layout" => Some(Rule::Word(WordField::InputLayout)),
        "tile_align" | "experimental_scheduler" | "return_residuals" | "fused_bwd" => Some(Rule::Bool),
        "vmem_limit_mib" => Some(Rule::Mib),
        "chip" | "mask" => Some(Rule::Text),
        "set" => Some(Rule::TextList),
        "kernel_ir" => Some(Rule::File),
        "runtime" => Some(Rule::RuntimeList),
        _ => None,
    }
}

/// The keys a job file may give (every field but the command line's `no_fused_bwd`).
pub fn file_keys() -> Vec<&'static str> {
    JobSpec::fields().iter().map(String::as_str).filter(|f| rule(f).is_some()).collect()
}

/// Checks one TOML value against its field's rule; the error is the allowed text
/// ([`Rule::allowed`]).
fn check_toml(r: Rule, v: &toml::Value) -> Result<(), String> {
    use toml::Value as T;
    let ok = match (r, v) {
        (Rule::Whole { .. } | Rule::Mib, T::Integer(i)) => r.accepts_whole(i128::from(*i)),
        (Rule::Mib, T::Float(f)) => f.is_finite() && *f > 0.0,
        (Rule::Word(w), T::String(s)) => w.accepts(s),
        (Rule::Bool, T::Boolean(_)) | (Rule::Text | Rule::File, T::String(_)) => true,
        (Rule::TextList | Rule::RuntimeList, T::Array(a)) => a.iter().all(|x| x.is_str()),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(r.allowed())
    }
}

/// A value as a TOML file writes it (`"10"`, `-1`, `1.5`, `true`).
fn toml_text(v: &toml::Value) -> String {
    match v {
        toml::Value::Float(f) if f.is_nan() => "nan".into(),
        other => other.to_string(),
    }
}

/// A job from a TOML table (a trace file, a sweep file's `[base]`, axis value or point), each key
/// checked against its field's rule first.
///
/// # Errors
/// The key, the value and what is allowed: `` `heads` = -1: expected a whole number from 1 to
/// 1048576 `` (the field in backticks), or `unknown key 'x'` with the keys a file may give.
pub fn spec_from_toml(t: &toml::Table) -> Result<JobSpec, String> {
    for (k, v) in t {
        let Some(r) = rule(k) else {
            return Err(format!("unknown key '{k}': the keys of a job are {}", file_keys().join(", ")));
        };
        check_toml(r, v).map_err(|allowed| format!("`{k}` = {}: {allowed}", toml_text(v)))?;
    }
    toml::Value::Table(t.clone()).try_into().map_err(|e: toml::de::Error| one_line(&e.to_string()))
}

/// A number as messages show it: non-finite values as `nan`, `inf` and `-inf` (as typed on the
/// command line and as Python prints them).
pub fn number_text(v: f64) -> String {
    if v.is_nan() {
        "nan".into()
    } else if v.is_infinite() {
        if v > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{v}")
    }
}

impl JobSpec {
    /// A setting `field=value` of this job as a note names it (the note's `` `field=value` ``,
    /// [`crate::render_settings`]): as the user gave it (`--masking none` or `masking = none`,
    /// `style` choosing), or as the kernel family's default when the spec does not give it.
    pub fn describe_setting(&self, field: &str, value: &str, style: crate::FieldStyle) -> String {
        if self.set_fields().contains_key(field) {
            match style {
                crate::FieldStyle::Flag if value == "true" => format!("--{}", field.replace('_', "-")),
                crate::FieldStyle::Flag => format!("--{} {value}", field.replace('_', "-")),
                crate::FieldStyle::Key => format!("{field} = {value}"),
            }
        } else {
            format!("{field} {value} (the default of the {} kernel family)", self.kernel())
        }
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Command};

    #[test]
    fn every_field_has_a_rule() {
        for f in JobSpec::fields() {
            assert!(rule(f).is_some() || f == "no_fused_bwd", "{f} has no rule");
        }
    }

    /// The command line's value parsers take exactly the range each rule states.
    #[test]
    fn command_line_ranges_are_the_rules() {
        let cmd = JobSpec::augment_args(Command::new("t"));
        let parses = |f: &str, v: &str| cmd.clone().try_get_matches_from(["t", &format!("--{}", f.replace('_', "-")), v]).is_ok();
        for f in JobSpec::fields() {
            if let Some(Rule::Whole { lo, hi }) = rule(f) {
                assert!(parses(f, &lo.to_string()) && parses(f, &hi.to_string()), "{f}");
                assert!(!parses(f, &(lo - 1).to_string()) && !parses(f, &(hi + 1).to_string()) && !parses(f, "1.5"), "{f}");
            }
        }
    }

    #[test]
    fn file_values_are_named_with_their_rule() {
        let t = |s: &str| spec_from_toml(&toml::from_str(s).unwrap());
        assert_eq!(t("heads = -1").unwrap_err(), "`heads` = -1: expected a whole number from 1 to 1048576");
        assert_eq!(t("heads = \"10\"").unwrap_err(), "`heads` = \"10\": expected a whole number from 1 to 1048576");
        assert_eq!(t("tile_align = 1").unwrap_err(), "`tile_align` = 1: expected true or false");
        assert_eq!(t("traversal = \"zig\"").unwrap_err(), "`traversal` = \"zig\": expected full-grid or compact");
        assert!(t("bogus = 1").unwrap_err().starts_with("unknown key 'bogus': the keys of a job are chip, set, kernel"));
        assert_eq!(t("heads = 4\nvmem_limit_mib = 16").unwrap().vmem_limit_mib, Some(16.0));
    }
}
