//! The command examples of README.md and studies/README.md (the `console` blocks: `$ tpusim ...`
//! and the output the docs show, with `...` and `[..]` where they elide) run as tests with
//! trycmd, so a changed output fails here instead of going stale in the docs. Update a block by
//! running its command and pasting the output (`TRYCMD=overwrite` rewrites the files in place).

use std::path::{Path, PathBuf};

#[test]
fn readme_and_studies_examples_print_what_the_docs_show() {
    let root: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    // The examples' paths are relative to the repository's root, as a user runs them.
    std::env::set_current_dir(&root).unwrap();
    trycmd::TestCases::new()
        .register_bin("tpusim", PathBuf::from(env!("CARGO_BIN_EXE_tpusim")))
        // No periodic progress line on stderr, however slow the machine.
        .env("TPUSIM_PROGRESS_SECS", "86400")
        .case(root.join("README.md"))
        .case(root.join("studies/README.md"));
}
