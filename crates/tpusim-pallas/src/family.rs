//! Which library kernel a description is, for the error band a report quotes (never for its
//! simulation: a family is a label, like `kernel_name`). The rule, one table for both front
//! ends (`tpusim.jax.describe` records the family it finds in the description's `family`; a
//! description without one is recognised when read), stated in
//! `traces/measured/kernels/README.md`:
//!
//! | family | kernel name | a source file of its ops |
//! |---|---|---|
//! | `rpa-v3-sglang` | starts with `RPA` | `ragged_paged_attention_v3.py` |
//! | `rpa-tpu-inference-v0.11.1` | starts with `RPA-` | `ragged_paged_attention.py` in a folder other than JAX's `pallas/ops/tpu` |
//! | `kv-cache-update` | `kv_cache_update_kernel` | `update_kv_cache.py` |
//! | `megablox-gmm` | `kernel` (megablox's generic name) | `gmm.py` in a folder whose name starts with `megablox` |
//! | `gmm-v2` | starts with `gmm_v2` | `gmm_v2.py` |
//!
//! Both columns must match: a kernel name alone is a label anyone may choose, and megablox's is
//! `kernel`. A file is matched by its name and, where the rule names one, its folder, so a
//! description whose locations keep only the file name (as `tpusim.jax` writes `loc`) is
//! recognised by the rules that need no folder; `describe` sees the full paths.

use crate::desc::{Description, Op};

/// What a kernel family word may be (a description's `family`, the `family=` of
/// `tpusim.jax`): the words of the table above, and any label a user gives.
pub const WORD_RULE: &str = "expected a kernel family word of letters, digits, `.`, `_` and `-` (e.g. \"megablox-gmm\"), at most 100 characters";

/// Whether `f` is a kernel family word ([`WORD_RULE`]).
pub fn is_word(f: &str) -> bool {
    !f.is_empty() && f.len() <= 100 && f.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// One row of the table (module docs).
struct Rule {
    family: &'static str,
    kernel: fn(&str) -> bool,
    file: fn(&std::path::Path) -> bool,
}

fn named(path: &std::path::Path, name: &str) -> bool {
    path.file_name().is_some_and(|f| f == name)
}

/// The folder a file is in (its last component), if the path names one.
fn folder(path: &std::path::Path) -> Option<String> {
    path.parent().and_then(|p| p.file_name()).map(|f| f.to_string_lossy().into_owned())
}

const RULES: &[Rule] = &[
    Rule { family: "rpa-v3-sglang", kernel: |k| k.starts_with("RPA"), file: |p| named(p, "ragged_paged_attention_v3.py") },
    Rule {
        family: "rpa-tpu-inference-v0.11.1",
        kernel: |k| k.starts_with("RPA-"),
        // JAX's own ragged paged attention (pallas/ops/tpu) is an earlier kernel of that name.
        file: |p| named(p, "ragged_paged_attention.py") && !p.to_string_lossy().contains("pallas/ops/tpu"),
    },
    Rule { family: "kv-cache-update", kernel: |k| k == "kv_cache_update_kernel", file: |p| named(p, "update_kv_cache.py") },
    Rule { family: "megablox-gmm", kernel: |k| k == "kernel", file: |p| named(p, "gmm.py") && folder(p).is_some_and(|f| f.starts_with("megablox")) },
    Rule { family: "gmm-v2", kernel: |k| k.starts_with("gmm_v2"), file: |p| named(p, "gmm_v2.py") },
];

/// The family of a kernel named `kernel_name` whose ops' source files are `files` (paths as the
/// lowering's locations give them, with or without folders), by the table of the module docs;
/// `None` when no row matches.
pub fn recognise<'a>(kernel_name: &str, files: impl IntoIterator<Item = &'a str> + Clone) -> Option<&'static str> {
    RULES
        .iter()
        .find(|r| (r.kernel)(kernel_name) && files.clone().into_iter().any(|f| (r.file)(std::path::Path::new(f))))
        .map(|r| r.family)
}

/// The source files of a description's ops (their `loc`, `file:line`), each once.
pub fn source_files(desc: &Description) -> Vec<String> {
    fn walk(ops: &[Op], out: &mut Vec<String>) {
        for op in ops {
            let file = op.loc.rsplit_once(':').map_or(op.loc.as_str(), |(f, _)| f);
            if !file.is_empty() && !out.iter().any(|f| f == file) {
                out.push(file.to_string());
            }
            walk(&op.then, out);
            walk(&op.otherwise, out);
        }
    }
    let mut out = Vec::new();
    walk(&desc.body, &mut out);
    out
}

/// The family of a description: the one it records (`family`), or the one the table finds from
/// its kernel name and its ops' locations.
pub fn of(desc: &Description) -> Option<String> {
    if let Some(f) = &desc.family {
        return Some(f.clone());
    }
    let files = source_files(desc);
    recognise(&desc.kernel_name, files.iter().map(String::as_str)).map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_the_name_and_the_file_decide() {
        assert_eq!(recognise("kernel", ["/site-packages/jax/experimental/pallas/ops/tpu/megablox/gmm.py"]), Some("megablox-gmm"));
        assert_eq!(recognise("kernel", ["/src/sgl_jax/srt/kernels/gmm/megablox_gmm_kernel/gmm.py"]), Some("megablox-gmm"));
        // A file name without its folder, or another folder's gmm.py, is not megablox's.
        assert_eq!(recognise("kernel", ["gmm.py"]), None);
        assert_eq!(recognise("kernel", ["/home/me/gmm.py"]), None);
        assert_eq!(recognise("my_kernel", ["/x/megablox/gmm.py"]), None);
        assert_eq!(recognise("RPAd-p_128-bq_1_1", ["ragged_paged_attention_v3.py"]), Some("rpa-v3-sglang"));
        assert_eq!(recognise("RPA-bq_1-bkvp_16", ["ragged_paged_attention.py"]), Some("rpa-tpu-inference-v0.11.1"));
        assert_eq!(recognise("RPA-bq_1-bkvp_16", ["/jax/experimental/pallas/ops/tpu/ragged_paged_attention.py"]), None);
        assert_eq!(recognise("kv_cache_update_kernel", ["update_kv_cache.py"]), Some("kv-cache-update"));
        assert_eq!(recognise("gmm_v2-g_512", ["gmm_v2.py"]), Some("gmm-v2"));
        assert_eq!(recognise("gmm_v2-g_512", ["other.py"]), None);
    }
}
