//! The VMEM rule (`tpusim_model::vmem`) against what the real compiler did: tilings that
//! compiled and ran must fit, tilings it refused must be refused with an estimate near the
//! compiler's. Each case is built as `tpusim run` builds it (the family's defaults, its scoped
//! limit) and prints its margin; `cargo test -p tpusim-job --test vmem_cases -- --nocapture`
//! shows the table.

use tpusim_chip::ChipModel;
use tpusim_kernel::{KernelError, Kernel};
use tpusim_job::JobSpec;

/// What the real compiler did with a case.
enum Expect {
    /// Compiled and ran.
    Runs,
    /// Refused, with the needed bytes this rule must estimate within (lo, hi).
    Refused(f64, f64),
}

struct Case {
    what: &'static str,
    spec: JobSpec,
    expect: Expect,
}

fn attention(chip: &str, kernel: Option<Kernel>) -> JobSpec {
    JobSpec { chip: Some(chip.into()), kernel, ..Default::default() }
}

fn cases() -> Vec<Case> {
    let v7x_bwd = |batch, len, blocks: (u64, u64, u64), mask: &str| JobSpec {
        batch: Some(batch),
        heads: Some(8),
        q_len: Some(len),
        kv_len: Some(len),
        head_dim: Some(256),
        direction: Some(tpusim_kernel::Direction::Bwd),
        block_q_dkv: Some(blocks.0),
        block_kv_dkv: Some(blocks.1),
        block_kv_dkv_compute: Some(blocks.2),
        scope: Some(tpusim_kernel::Scope::Op),
        exp: Some(tpusim_kernel::Exp::Base2),
        mask: Some(mask.into()),
        ..attention("v7x", None)
    };
    let vit = |kernel| JobSpec {
        heads: Some(16),
        seq_len: Some(25344),
        head_dim: Some(80),
        block_q: Some(128),
        block_kv: Some(25344),
        block_kv_compute: Some(25344),
        ..attention("v6e", kernel)
    };
    let mut v = vec![
        Case {
            what: "MaxDiffusion PR 416: mask-free kernel at block_q 8448 x 1024 x 1024, 64 MiB",
            spec: JobSpec {
                heads: Some(10),
                seq_len: Some(75600),
                block_q: Some(8448),
                block_kv: Some(1024),
                block_kv_compute: Some(1024),
                vmem_limit_mib: Some(64.0),
                ..attention("v6e", Some(Kernel::SplashDense))
            },
            expect: Expect::Runs,
        },
        Case { what: "tokamax v7x backward autotune: 8 x 16384, d 256, dkv 1024 / 4096 / 512", spec: v7x_bwd(1, 16384, (1024, 4096, 512), "full"), expect: Expect::Runs },
        Case { what: "tokamax v7x backward autotune: 2 x 8 x 8192, d 256, dkv 2048 / 2048 / 512, full", spec: v7x_bwd(2, 8192, (2048, 2048, 512), "full"), expect: Expect::Runs },
        Case { what: "tokamax v7x backward autotune: 2 x 8 x 8192, d 256, dkv 2048 / 2048 / 512, causal", spec: v7x_bwd(2, 8192, (2048, 2048, 512), "causal"), expect: Expect::Runs },
        Case {
            what: "vllm tpu-inference PR 3407: ViT bf16[1,16,25344,80], block_q 128, one kv step (compiler: 37.22 MiB)",
            spec: vit(None),
            expect: Expect::Refused(33.6e6, 41e6),
        },
        Case {
            what: "the same tiling as the older flash attention it ran as",
            spec: vit(Some(Kernel::FlashAttention)),
            expect: Expect::Refused(33.6e6, 41e6),
        },
    ];
    // Every attention family at its own default blocks and scoped limit on the default workload.
    for k in Kernel::ALL.iter().copied().filter(|k| k.kind() == tpusim_model::KernelKind::Attention) {
        v.push(Case { what: k.word(), spec: attention("v6e", Some(k)), expect: Expect::Runs });
    }
    v
}

#[test]
fn vmem_rule_agrees_with_the_real_compiler() {
    let mut failures = Vec::new();
    println!("{:<100} {:>10} {:>10} {:>8}", "case", "needed MB", "limit MB", "margin");
    for c in cases() {
        let chip = ChipModel::preset(c.spec.chip.as_deref().unwrap_or("v6e")).unwrap();
        let job = c.spec.build(&chip).unwrap_or_else(|e| panic!("{}: {e}", c.what));
        let (needed, limit, ok) = match (job.lower(&chip), &c.expect) {
            (Ok(l), Expect::Runs) => {
                let v = l.phases.iter().filter_map(|p| match &p.work {
                    tpusim_model::PhaseWork::Kernel(k) => Some(&k.vmem),
                    _ => None,
                });
                let worst = v.max_by(|a, b| (a.total() as f64 / a.limit_bytes as f64).total_cmp(&(b.total() as f64 / b.limit_bytes as f64))).unwrap();
                (worst.total(), worst.limit_bytes, true)
            }
            (Err(tpusim_job::JobError::Kernel(KernelError::Vmem { needed, limit, .. })), Expect::Refused(lo, hi)) => (needed, limit, (*lo..=*hi).contains(&(needed as f64))),
            (Ok(_), Expect::Refused(..)) => (0, 0, false),
            (Err(e), _) => {
                failures.push(format!("{}: {e}", c.what));
                continue;
            }
        };
        println!(
            "{:<100} {:>10.2} {:>10.2} {:>+7.1}%",
            c.what,
            needed as f64 / 1e6,
            limit as f64 / 1e6,
            100.0 * (limit as f64 - needed as f64) / limit as f64
        );
        if !ok {
            failures.push(format!("{}: needed {needed} bytes, limit {limit}", c.what));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
