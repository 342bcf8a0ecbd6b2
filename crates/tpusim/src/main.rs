//! `tpusim`: the command-line front end. Parses flags, builds a chip, workload and kernel
//! configuration, runs them through `tpusim-report`, and prints the result. Nothing else.
//!
//! Exit codes: 0 success, 2 usage or input error, 1 internal failure.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::process::ExitCode;
use tpusim_chip::ChipModel;
use tpusim_kernel::{splash, MaskSource, Masking, MatmulConfig, SplashConfig, Traversal};
use tpusim_report::{run, Job, Report};
use tpusim_workload::{AttentionCall, Mask, MatmulCall};

#[derive(Parser, Debug)]
#[command(name = "tpusim", version, about = "Cycle-approximate TPU simulator for attention kernels", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Simulate one kernel call and report latency, utilisation and the bounding unit.
    ///
    /// With no workload or block flags it runs the built-in default: Wan 2.1 720p attention
    /// (1 x 10 heads x 75,600 tokens, head_dim 128, full mask) with MaxDiffusion's v6e blocks
    /// (3024 / 2048 / 1024) on v6e.
    Run(RunArgs),
    /// Inspect chip models.
    Chip {
        #[command(subcommand)]
        command: ChipCommand,
    },
}

#[derive(Subcommand, Debug)]
enum ChipCommand {
    /// Print a chip model: every parameter with its unit and source (or the rows it was fitted to).
    Show {
        /// Preset name (v6e, v5e, v5p, v4, v7x) or path to a chip TOML.
        chip: String,
        /// Change a parameter, e.g. --set hbm.bandwidth_gb_per_s=3276 (repeatable).
        #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
        set: Vec<String>,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// List the built-in chip models.
    List,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Format {
    Table,
    Json,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Kernel {
    /// Splash-style flash attention (forward).
    Splash,
    /// Blocked Pallas matmul.
    Matmul,
}

#[derive(Args, Debug)]
struct RunArgs {
    /// Chip: preset name (v6e, v5e, v5p, v4, v7x) or path to a chip TOML.
    #[arg(long, default_value = "v6e")]
    chip: String,
    /// Change a chip parameter for this run, e.g. --set hbm.bandwidth_gb_per_s=3276 (repeatable).
    #[arg(long = "set", value_name = "SECTION.FIELD=VALUE")]
    set: Vec<String>,
    /// Kernel to simulate.
    #[arg(long, value_enum, default_value_t = Kernel::Splash)]
    kernel: Kernel,
    /// Batch size.
    #[arg(long)]
    batch: Option<u64>,
    /// Query heads.
    #[arg(long)]
    heads: Option<u64>,
    /// Key/value heads (defaults to --heads; fewer is GQA/MQA).
    #[arg(long)]
    kv_heads: Option<u64>,
    /// Sequence length for both q and kv.
    #[arg(long, conflicts_with_all = ["q_len", "kv_len"])]
    seq_len: Option<u64>,
    /// Query length.
    #[arg(long)]
    q_len: Option<u64>,
    /// Key/value length.
    #[arg(long)]
    kv_len: Option<u64>,
    /// Head dimension of q and k.
    #[arg(long)]
    head_dim: Option<u64>,
    /// Head dimension of v and o (defaults to --head-dim).
    #[arg(long)]
    head_dim_v: Option<u64>,
    /// Mask: full, causal, local:L,R, band:W, sink:S, chunked:C, file:PATH; + is union, & is
    /// intersection, ( ) groups. Example: band:15000+sink:3600.
    #[arg(long)]
    mask: Option<String>,
    /// Rows of q per block (multiple of 8).
    #[arg(long)]
    block_q: Option<u64>,
    /// Rows of k/v per block (multiple of 128).
    #[arg(long)]
    block_kv: Option<u64>,
    /// Width of the inner matmul/softmax sub-tile (multiple of 128 dividing --block-kv).
    /// Default: --block-kv, or the largest such width whose tiling fits the VMEM limit.
    #[arg(long)]
    block_kv_compute: Option<u64>,
    /// Which grid steps run: full-grid (JAX Splash) or compact (non-empty tiles only).
    #[arg(long, value_enum)]
    traversal: Option<TraversalArg>,
    /// Which visited tiles apply the element-wise mask.
    #[arg(long, value_enum)]
    masking: Option<MaskingArg>,
    /// How the mask is evaluated: computed from iota, or loaded as int8 blocks.
    #[arg(long, value_enum)]
    mask_source: Option<MaskSourceArg>,
    /// Round the mask to whole tiles (keep a tile when at least half its pairs are kept).
    #[arg(long)]
    tile_align: bool,
    /// Scoped VMEM limit, MiB (default: the chip's).
    #[arg(long)]
    vmem_limit_mib: Option<f64>,
    /// Matmul M.
    #[arg(long)]
    m: Option<u64>,
    /// Matmul N.
    #[arg(long)]
    n: Option<u64>,
    /// Matmul K.
    #[arg(long)]
    k: Option<u64>,
    /// Matmul block M.
    #[arg(long)]
    block_m: Option<u64>,
    /// Matmul block N.
    #[arg(long)]
    block_n: Option<u64>,
    /// Matmul block K.
    #[arg(long)]
    block_k: Option<u64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum TraversalArg {
    FullGrid,
    Compact,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum MaskingArg {
    All,
    Partial,
    None,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum MaskSourceArg {
    Computed,
    Loaded,
}

/// An error for the user: printed once, exit code 2.
struct InputError(String);

impl<E: std::fmt::Display> From<E> for InputError {
    fn from(e: E) -> Self {
        InputError(e.to_string())
    }
}

fn load_chip(spec: &str, sets: &[String]) -> Result<ChipModel, InputError> {
    let mut chip = ChipModel::load(spec)?;
    for s in sets {
        let (k, v) = s
            .split_once('=')
            .ok_or_else(|| InputError(format!("--set {s}: expected SECTION.FIELD=VALUE, e.g. hbm.bandwidth_gb_per_s=3276")))?;
        chip = chip.with_override(k.trim(), v.trim())?;
    }
    Ok(chip)
}

fn vmem_limit(mib: Option<f64>, chip: &ChipModel) -> Result<Option<u64>, InputError> {
    match mib {
        None => Ok(None),
        Some(v) if v.is_finite() && v > 0.0 && v <= chip.vmem.size_mib.value => Ok(Some((v * 1048576.0) as u64)),
        Some(v) => Err(InputError(format!(
            "--vmem-limit-mib = {v}: expected a number above 0 and at most the chip's physical VMEM ({} MiB)",
            chip.vmem.size_mib.value
        ))),
    }
}

fn build_job(a: &RunArgs, chip: &ChipModel) -> Result<Job, InputError> {
    let vmem_limit_bytes = vmem_limit(a.vmem_limit_mib, chip)?;
    match a.kernel {
        Kernel::Matmul => {
            let attention_only = [
                ("--heads", a.heads.is_some()),
                ("--seq-len", a.seq_len.is_some()),
                ("--mask", a.mask.is_some()),
                ("--block-q", a.block_q.is_some()),
                ("--block-kv", a.block_kv.is_some()),
            ];
            if let Some((f, _)) = attention_only.iter().find(|(_, set)| *set) {
                return Err(InputError(format!("{f} applies to --kernel splash, not --kernel matmul (use --m --n --k --block-m --block-n --block-k)")));
            }
            let (m, n, k) = match (a.m, a.n, a.k) {
                (Some(m), Some(n), Some(k)) => (m, n, k),
                _ => return Err(InputError("--kernel matmul needs --m, --n and --k".into())),
            };
            let workload = MatmulCall { m, n, k };
            workload.validate()?;
            let d = MatmulConfig::defaults_for(&workload);
            let config = MatmulConfig {
                block_m: a.block_m.unwrap_or(d.block_m),
                block_n: a.block_n.unwrap_or(d.block_n),
                block_k: a.block_k.unwrap_or(d.block_k),
                vmem_limit_bytes,
            };
            Ok(Job::Matmul { workload, config })
        }
        Kernel::Splash => {
            let matmul_only = [("--m", a.m), ("--n", a.n), ("--k", a.k), ("--block-m", a.block_m), ("--block-n", a.block_n), ("--block-k", a.block_k)];
            if let Some((f, _)) = matmul_only.iter().find(|(_, v)| v.is_some()) {
                return Err(InputError(format!("{f} applies to --kernel matmul, not --kernel splash")));
            }
            let base = AttentionCall::video_default();
            let workload_given = a.batch.is_some()
                || a.heads.is_some()
                || a.kv_heads.is_some()
                || a.seq_len.is_some()
                || a.q_len.is_some()
                || a.kv_len.is_some()
                || a.head_dim.is_some()
                || a.head_dim_v.is_some();
            let heads = a.heads.unwrap_or(base.q_heads);
            let head_dim = a.head_dim.unwrap_or(base.head_dim);
            let mask = match &a.mask {
                Some(s) => Mask::parse(s)?,
                None => Mask::Full,
            };
            let workload = AttentionCall {
                batch: a.batch.unwrap_or(base.batch),
                q_heads: heads,
                kv_heads: a.kv_heads.unwrap_or(heads),
                q_len: a.seq_len.or(a.q_len).unwrap_or(base.q_len),
                kv_len: a.seq_len.or(a.kv_len).unwrap_or(base.kv_len),
                head_dim,
                head_dim_v: a.head_dim_v.unwrap_or(head_dim),
                mask,
            };
            workload.validate()?;
            let mut config = SplashConfig::defaults_for(&workload, chip);
            let blocks_given = a.block_q.is_some() || a.block_kv.is_some() || a.block_kv_compute.is_some();
            if !workload_given && !blocks_given {
                // The built-in default case carries MaxDiffusion's v6e blocks for Wan 2.1 720p.
                config.block_q = 3024;
                config.block_kv = 2048;
                config.block_kv_compute = 1024;
            }
            if let Some(v) = a.block_q {
                config.block_q = v;
            }
            if let Some(v) = a.block_kv {
                config.block_kv = v;
            }
            if let Some(t) = a.traversal {
                config.traversal = match t {
                    TraversalArg::FullGrid => Traversal::FullGrid,
                    TraversalArg::Compact => Traversal::Compact,
                };
            }
            if let Some(m) = a.masking {
                config.masking = match m {
                    MaskingArg::All => Masking::All,
                    MaskingArg::Partial => Masking::Partial,
                    MaskingArg::None => Masking::None,
                };
            }
            if let Some(s) = a.mask_source {
                config.mask_source = match s {
                    MaskSourceArg::Computed => MaskSource::Computed,
                    MaskSourceArg::Loaded => MaskSource::Loaded,
                };
            }
            config.tile_align = a.tile_align;
            config.vmem_limit_bytes = vmem_limit_bytes;
            config.block_kv_compute = match a.block_kv_compute {
                Some(v) => v,
                None if !workload_given && !blocks_given => config.block_kv_compute,
                None => splash::default_compute(&workload, &config, chip),
            };
            Ok(Job::Splash { workload, config })
        }
    }
}

fn cmd_run(a: &RunArgs) -> Result<String, InputError> {
    let chip = load_chip(&a.chip, &a.set)?;
    let job = build_job(a, &chip)?;
    let r = run(&chip, &job)?;
    let rep = Report::from_run(&r);
    Ok(match a.format {
        Format::Json => rep.to_json(),
        Format::Table => rep.to_table(),
    })
}

fn cmd_chip_show(spec: &str, sets: &[String], format: Format) -> Result<String, InputError> {
    let chip = load_chip(spec, sets)?;
    Ok(match format {
        Format::Json => serde_json::to_string_pretty(&chip).map_err(|e| InputError(e.to_string()))?,
        Format::Table => {
            let mut s = format!("{}: {}\n", chip.name, chip.description);
            s.push_str(&format!(
                "derived: peak {:.1} TFLOP/s bf16, sustained HBM {:.0} GB/s, {} vector register elements\n\n",
                chip.peak_flops() / 1e12,
                chip.hbm_bytes_per_cycle() * chip.clock_hz() / 1e9,
                chip.vreg_elems()
            ));
            for r in chip.rows() {
                s.push_str(&format!("{:<36} {:>10} {:<28} {}\n", r.field, r.value, r.unit, r.provenance));
            }
            s
        }
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = match &cli.command {
        Command::Run(a) => cmd_run(a),
        Command::Chip { command: ChipCommand::Show { chip, set, format } } => cmd_chip_show(chip, set, *format),
        Command::Chip { command: ChipCommand::List } => Ok(tpusim_chip::PRESETS
            .iter()
            .map(|p| match ChipModel::preset(p) {
                Ok(c) => format!("{p:<5} {}\n", c.description),
                Err(e) => format!("{p:<5} (invalid: {e})\n"),
            })
            .collect()),
    };
    match out {
        Ok(s) => {
            print!("{s}");
            if !s.ends_with('\n') {
                println!();
            }
            ExitCode::SUCCESS
        }
        Err(InputError(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
