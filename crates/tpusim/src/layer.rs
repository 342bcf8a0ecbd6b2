//! `tpusim layer`: one transformer block of a video DiT on a slice of chips (crate
//! `tpusim-layer`).

use crate::error::CliError;
use crate::run::Format;
use clap::Args;
use tpusim_layer::spec::render_layer_fields;
use tpusim_layer::{LayerError, LayerSpec};
use tpusim_job::JobSpec;

/// Flags of `tpusim layer`.
#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  tpusim layer                                   # Wan 2.1 14B, 720p, dense, on a v6e-8 (2x4)\n  tpusim layer --attention sparse --steps 40 --target-speedup 1.28\n  tpusim layer --attention sparse --permutation before\n  tpusim layer --resolution 1440p --slice 16 --set ici.link_bandwidth_gb_per_s=200\n  tpusim layer --format json --timeline layer.json"
)]
pub struct LayerArgs {
    /// Chip of every device: preset name (v6e, v5e, v5p, v4, v7x) or path to a chip TOML
    /// [default: v6e].
    #[arg(long)]
    pub chip: Option<String>,
    /// Change a chip parameter, e.g. --set ici.link_bandwidth_gb_per_s=200 (repeatable).
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    pub set: Vec<String>,
    #[command(flatten)]
    pub layer: LayerSpec,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also write the layer's timeline as a Chrome trace (Perfetto, chrome://tracing): one track
    /// for the TensorCore's ops, one per unit and one for the ICI.
    #[arg(long, value_name = "FILE.json")]
    pub timeline: Option<String>,
    /// Replace the --timeline file even if `tpusim layer --timeline` did not write it.
    #[arg(long, requires = "timeline")]
    pub force: bool,
}

/// A layer error for the user: layer fields named as flags.
pub fn layer_error(e: LayerError) -> CliError {
    CliError::input(render_layer_fields(&e.to_string(), true))
}

/// The chip of `--chip` and `--set`.
pub fn chip(chip: &Option<String>, set: &[String]) -> Result<tpusim_chip::ChipModel, CliError> {
    Ok(JobSpec { chip: chip.clone(), set: set.to_vec(), ..Default::default() }.chip()?)
}

pub fn cmd_layer(a: &LayerArgs) -> Result<String, CliError> {
    if let Some(path) = &a.timeline {
        tpusim_io::check_replace(std::path::Path::new(path), "layer --timeline", a.force)
            .map_err(|e| CliError::input(format!("--timeline {e}")))?;
    }
    let chip = chip(&a.chip, &a.set)?;
    let run = tpusim_layer::run(&a.layer, &chip).map_err(layer_error)?;
    let mut rep = run.report();
    let (table, bottleneck) = tpusim_layer::what_if_2x(&a.layer, &chip, &run).map_err(layer_error)?;
    rep.what_if_2x = Some(table);
    rep.bottleneck = Some(bottleneck);
    let mut out = match a.format {
        Format::Json => rep.to_json(),
        Format::Table => rep.to_table(),
    };
    if let Some(path) = &a.timeline {
        let mut trace = tpusim_layer::trace::chrome_trace(&run.result);
        // The overwrite rule's mark (tpusim_io::mark).
        trace[tpusim_io::mark::JSON_KEY] = serde_json::Value::String(tpusim_io::mark::mark_value("layer --timeline"));
        let text = serde_json::to_string(&trace).map_err(|e| CliError::Internal(e.to_string()))?;
        tpusim_io::write_atomic(std::path::Path::new(path), text.as_bytes()).map_err(|e| {
            if e.is_refusal() {
                CliError::input(format!("--timeline {e}"))
            } else {
                CliError::Internal(format!("--timeline {e}"))
            }
        })?;
        if a.format == Format::Table {
            out.push_str(&format!("  timeline     {path}: {} ops on 8 tracks (TensorCore ops, MXU, VPU, EUP, XLU, HBM, step control, ICI); open in Perfetto or chrome://tracing\n", run.result.graph.graph.node_count()));
        }
    }
    Ok(out)
}
