//! What a library call runs: its Pallas kernels and the XLA ops around them, as a sequence of
//! [`Phase`]s ([`lower_attention`]).
//!
//! * **Forward**: the forward kernel. Residuals, when returned, come out lane-replicated (f32,
//!   128 lanes per q row) and XLA slices one lane of each (a fusion reading the whole arrays;
//!   counted in scope `op`).
//! * **Backward** (Splash's `_splash_attention_bwd`): `di = rowsum(dO * O)` in f32 and the
//!   sublane broadcast of logsumexp and di to 8 rows (XLA), then the fused dq/dk/dv kernel, or
//!   JAX's dq and dkv kernels. The sum of the fused kernel's per-kv-block dq partials (XLA) counts
//!   in scope `op`, with the library's other ops.
//! * **Scope `op`** adds the ops the library's public API runs around the kernels; **scope
//!   `call`** the same plus the host's dispatch and sync of the jitted call (what a host timer
//!   around `block_until_ready` sees; mask info built on the host at trace time costs nothing per
//!   call). A caller whose arrays are [batch, sequence, heads, head_dim]
//!   ([`crate::options::InputLayout::Bshd`]: tokamax's API, and the Splash layers of axlearn and
//!   Levanter) pays the swaps of sequence and heads axes described next. tokamax
//!   (`pallas_mosaic_tpu.py` `_fwd`, `pallas_mosaic_tpu_vjp.py`) takes sequence-major tensors
//!   (batch, seq, heads, dim): it multiplies q by the logits scale and swaps the sequence and head
//!   axes of q, k and v before the kernel and of the output after it (one fusion each: the scale
//!   fuses into q's transpose); its backward swaps q, k, v, dO and O in, rescales logsumexp for
//!   base-2 exp, and swaps dq (scaled), dk and dv back. The measured tokamax timings do not say
//!   which q/k/v layouts were tuned; tokamax's heuristic default, HEAD_DIM_MINOR, is assumed.
//!   JAX's Splash and MaxDiffusion's kernels take head-major tensors and add nothing unless the
//!   caller's layout is bshd (then the same four swaps, q's scaling folded into its own).
//!
//! Every XLA op is an HBM-bound [`Fusion`]: the engine times it as its bytes read and written at
//! the device's sustained bandwidth plus one HBM round trip of latency. When a forward and its
//! backward run together (`fwd+bwd`), each keeps its own transposes (no common subexpression
//! across the custom VJP is assumed).

use crate::options::{Direction, Kernel, Scope};
use crate::splash::{self, bwd, SplashConfig};
use crate::KernelError;
pub use tpusim_model::call::{Fusion, Lowered, Part, Phase, PhaseWork};
use tpusim_chip::ChipModel;
use tpusim_workload::AttentionCall;

fn fusion(name: impl Into<String>, read_bytes: u64, write_bytes: u64) -> PhaseWork {
    PhaseWork::Fusion(Fusion { name: name.into(), read_bytes, write_bytes })
}

/// Lowers an attention call: the forward, the backward or both, in `scope` (module docs).
///
/// # Errors
/// The kernels' lowering errors ([`KernelError`]).
pub fn lower_attention(
    chip: &ChipModel,
    w: &AttentionCall,
    cfg: &SplashConfig,
    direction: Direction,
    scope: Scope,
) -> Result<Lowered, KernelError> {
    // Scope `op` and `call` run every device op of the call; `call` adds the host's dispatch.
    let ops = scope != Scope::Kernel;
    let wrapped = ops && cfg.input_layout == crate::options::InputLayout::Bshd;
    let bh = w.batch * w.q_heads;
    let bkvh = w.batch * w.kv_heads;
    let (q, k, v) = (bh * w.q_len * w.head_dim * 2, bkvh * w.kv_len * w.head_dim * 2, bkvh * w.kv_len * w.head_dim_v * 2);
    let o = bh * w.q_len * w.head_dim_v * 2;
    let rows_f32 = bh * w.q_len * 4;
    let mut phases = Vec::new();
    let mut push = |part: Part, work: PhaseWork| phases.push(Phase { part, work });
    if direction != Direction::Bwd {
        let residuals = cfg.return_residuals || direction == Direction::FwdBwd;
        let fcfg = SplashConfig { return_residuals: residuals, ..cfg.clone() };
        if wrapped {
            push(Part::Wrapper, fusion("transpose q (x logits scale)", q, q));
            push(Part::Wrapper, fusion("transpose k", k, k));
            push(Part::Wrapper, fusion("transpose v", v, v));
        }
        push(Part::Forward, PhaseWork::Kernel(std::sync::Arc::new(splash::lower(chip, w, &fcfg)?)));
        if residuals && ops {
            // Lane 0 of the lane-replicated logsumexp and max logits (f32 x 128 per q row).
            push(Part::Wrapper, fusion("slice residuals", 2 * rows_f32 * 128, 2 * rows_f32));
        }
        if wrapped {
            push(Part::Wrapper, fusion("transpose o", o, o));
        }
    }
    if direction != Direction::Fwd {
        if wrapped {
            push(Part::Wrapper, fusion("transpose q (x logits scale)", q, q));
            push(Part::Wrapper, fusion("transpose k", k, k));
            push(Part::Wrapper, fusion("transpose v", v, v));
            push(Part::Wrapper, fusion("transpose dO", o, o));
            push(Part::Wrapper, fusion("transpose o", o, o));
            if cfg.exp == crate::options::Exp::Base2 && cfg.kernel.defaults().transposes_around {
                push(Part::Wrapper, fusion("logsumexp x log2(e)", rows_f32, rows_f32));
            }
        }
        push(Part::Di, fusion("di = rowsum(dO x o)", 2 * o, rows_f32));
        push(Part::Di, fusion("broadcast logsumexp and di to 8 sublanes", 2 * rows_f32, 2 * 8 * rows_f32));
        let b = cfg.bwd;
        if b.fused {
            let dkv = bwd::lower_dkv(chip, w, cfg)?;
            let kv_blocks = w.kv_len.div_ceil(b.block_kv_dkv);
            let elem = if cfg.kernel == Kernel::TokamaxSplash && kv_blocks > 4 { 4 } else { 2 };
            let padded_q = w.q_len.next_multiple_of(b.block_q_dkv);
            let partials = kv_blocks * bh * padded_q * w.head_dim * elem;
            push(Part::FusedBackward, PhaseWork::Kernel(std::sync::Arc::new(dkv)));
            if ops {
                push(Part::Wrapper, fusion("sum dq partials", partials, q));
            }
        } else {
            push(Part::Dq, PhaseWork::Kernel(std::sync::Arc::new(bwd::lower_dq(chip, w, cfg)?)));
            push(Part::Dkv, PhaseWork::Kernel(std::sync::Arc::new(bwd::lower_dkv(chip, w, cfg)?)));
        }
        if wrapped {
            push(Part::Wrapper, fusion("transpose dq (x logits scale)", q, q));
            push(Part::Wrapper, fusion("transpose dk", k, k));
            push(Part::Wrapper, fusion("transpose dv", v, v));
        }
    }
    Ok(Lowered { phases, host_calls: u32::from(scope == Scope::Call) })
}
