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

/// Every command in the docs' console blocks is one line: pasted into a shell, a continuation
/// line (trycmd's `> `) would run as a second command (`> --mask ...` creates a file named
/// `--mask`).
#[test]
fn console_commands_are_one_line_each() {
    let root: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for doc in ["README.md", "studies/README.md"] {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let mut in_console = false;
        let mut commands = 0;
        for (i, line) in text.lines().enumerate() {
            if line.starts_with("```") {
                in_console = line.trim() == "```console";
                continue;
            }
            if !in_console {
                continue;
            }
            if line.starts_with("$ ") {
                commands += 1;
                assert!(!line.trim_end().ends_with('\\'), "{doc}:{}: a command continued with \\: {line}", i + 1);
            }
            assert!(!line.starts_with("> "), "{doc}:{}: a continuation line; write the command on one line: {line}", i + 1);
        }
        assert!(commands > 0, "{doc} has console examples");
    }
}
