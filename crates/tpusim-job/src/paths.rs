//! Paths inside job files: a trace (`--trace FILE.toml`) or a sweep file names other files, a chip
//! model (`chip = "my-v6e.toml"`), mask files (`mask = "file:blocks.json"`), a kernel description
//! (`kernel_ir = "kernel.json"`) and its runtime values (`runtime = ["lengths=lengths.npy"]`). Relative paths
//! there resolve from the folder of the file that names them, not from the current folder, so a
//! trace and its mask file can be moved or run from anywhere together. Paths given on the command
//! line (flags) resolve from the current folder as usual. Absolute paths are kept.

use crate::JobSpec;
use std::path::{Path, PathBuf};
use tpusim_chip::PRESETS;
use tpusim_workload::Mask;

/// `path` resolved from `dir` when relative.
fn resolve(dir: &Path, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        dir.join(p)
    }
}

/// A chip value names a file (rather than a preset) when it is not a preset name and ends with
/// `.toml` or holds a path separator.
fn is_chip_path(chip: &str) -> bool {
    !PRESETS.contains(&chip) && (chip.ends_with(".toml") || chip.contains('/') || chip.contains(std::path::MAIN_SEPARATOR))
}

/// The error for a named file that is not there after resolution.
fn missing(key: &str, written: &str, resolved: &Path) -> String {
    format!(
        "{key} = \"{written}\": {} does not exist (relative paths in a trace or sweep file resolve from that file's folder)",
        resolved.display()
    )
}

impl JobSpec {
    /// Rewrites the relative file paths of `chip`, of `mask`'s `file:PATH` terms, of `kernel_ir`
    /// and of `runtime`'s files as seen from `dir`, the folder of the trace or sweep file this
    /// spec was read from (module docs). A mask that does not parse, and a `runtime` entry
    /// without `=`, are left as written (building the job reports them).
    ///
    /// # Errors
    /// A message naming the key, the path as written and the resolved path when a named file
    /// does not exist.
    pub fn resolve_paths_from(&mut self, dir: &Path) -> Result<(), String> {
        if dir.as_os_str().is_empty() {
            // A file in the current folder: its relative paths already resolve from there; only
            // check that what it names exists.
            return self.check_named_files();
        }
        if let Some(chip) = &self.chip {
            if is_chip_path(chip) && Path::new(chip).is_relative() {
                let r = resolve(dir, chip);
                if !r.exists() {
                    return Err(missing("chip", chip, &r));
                }
                self.chip = Some(r.to_string_lossy().into_owned());
            }
        }
        if let Some(text) = &self.mask {
            if let Ok(m) = Mask::parse(text) {
                if m.file_paths().iter().any(|p| Path::new(p).is_relative()) {
                    let mut err = None;
                    let m = m.map_files(&mut |p| {
                        let r = resolve(dir, p);
                        if !r.exists() && err.is_none() {
                            err = Some(missing("mask", text, &r));
                        }
                        r.to_string_lossy().into_owned()
                    });
                    if let Some(e) = err {
                        return Err(e);
                    }
                    self.mask = Some(m.to_string());
                }
            }
        }
        if let Some(k) = &self.kernel_ir {
            let r = resolve(dir, k);
            if !r.exists() {
                return Err(missing("kernel_ir", k, &r));
            }
            self.kernel_ir = Some(r.to_string_lossy().into_owned());
        }
        for entry in &mut self.runtime {
            if let Some((name, file)) = entry.split_once('=') {
                let r = resolve(dir, file);
                if !r.exists() {
                    return Err(missing("runtime", entry, &r));
                }
                *entry = format!("{name}={}", r.to_string_lossy());
            }
        }
        Ok(())
    }

    /// The files this spec names that do not exist, as an error naming the first.
    fn check_named_files(&self) -> Result<(), String> {
        if let Some(chip) = &self.chip {
            if is_chip_path(chip) && !Path::new(chip).exists() {
                return Err(missing("chip", chip, Path::new(chip)));
            }
        }
        if let Some(text) = &self.mask {
            if let Ok(m) = Mask::parse(text) {
                if let Some(p) = m.file_paths().into_iter().find(|p| !Path::new(p).exists()) {
                    return Err(missing("mask", text, Path::new(&p)));
                }
            }
        }
        if let Some(k) = self.kernel_ir.as_deref().filter(|k| !Path::new(k).exists()) {
            return Err(missing("kernel_ir", k, Path::new(k)));
        }
        if let Some(entry) = self.runtime.iter().find(|e| e.split_once('=').is_some_and(|(_, f)| !Path::new(f).exists())) {
            let file = entry.split_once('=').map_or("", |(_, f)| f);
            return Err(missing("runtime", entry, Path::new(file)));
        }
        Ok(())
    }
}
