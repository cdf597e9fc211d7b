//! What the steps measure per prompt, before any statistic: a variant's [`Trace`] (with its
//! [`RoutingTrace`] for a model with experts) and the reference's [`CompactReference`]. These are
//! data that the run makes (`run/`), the stores and parts keep (`persist/`) and the statistics
//! read (`assemble/`), so they live below all three; computing a compact reference is
//! `run/compact.rs`'s.

use qdrift_score::{CompactChunk, PromptLogProbs, TOP_K, TopKAgreement};

/// What one prompt yields for one variant, over `H = max(horizons)` generated positions.
///
/// Teacher-forced fields are on the *reference's* continuation (`ref_tokens`), except
/// `logp_ref_on_var_text`, which is the reference scoring the variant's own continuation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// The reference's greedy continuation, `[H]`.
    pub ref_tokens: Vec<u32>,
    /// The variant's greedy continuation, `[H]`.
    pub var_tokens: Vec<u32>,
    /// KL(P_ref ‖ P_var) per position, nats, `[H]`.
    pub kld: Vec<f32>,
    /// KL(P_var ‖ P_ref) per position, nats, `[H]`.
    pub kld_reverse: Vec<f32>,
    /// Speculative sampling's acceptance `Σ min(p_ref, p_var)` per position, `[H]`.
    pub accept: Vec<f32>,
    /// Where the two top-5 lists agree, per position, `[H]`.
    pub top_k: Vec<TopKAgreement>,
    /// Top-1 agreement per position, `[H]`.
    pub top1: Vec<bool>,
    /// `ln p_ref(ref token)`, `[H]`.
    pub logp_ref: Vec<f32>,
    /// `ln p_var(ref token)`, `[H]`.
    pub logp_var: Vec<f32>,
    /// Entropy of P_ref, nats, `[H]`.
    pub ref_entropy: Vec<f32>,
    /// `ln p_ref(var token)` on the variant's continuation, `[H]`.
    pub logp_ref_on_var_text: Vec<f32>,
    /// For a model with experts, where the two models' routing differs (`None` for a dense
    /// model).
    pub routing: Option<RoutingTrace>,
}

/// Where a variant's expert choices differ from the reference's, for one prompt: per
/// mixture-of-experts layer and position, both models teacher-forced on the same text (the
/// reference's continuation, and the variant's own).
///
/// # Shapes
/// `layers: [L]`; every other field `[L, H]`, row-major (layer-major).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutingTrace {
    /// Experts per layer.
    pub experts: u32,
    /// Experts per token (`k`).
    pub top_k: u32,
    /// The mixture-of-experts blocks, ascending.
    pub layers: Vec<u32>,
    /// On the reference's text: how many of the `k` experts both models chose.
    pub shared: Vec<u8>,
    /// On the reference's text: whether both chose the same top-1 expert.
    pub top1: Vec<bool>,
    /// [`RoutingTrace::shared`] on the variant's continuation.
    pub shared_on_var_text: Vec<u8>,
    /// [`RoutingTrace::top1`] on the variant's continuation.
    pub top1_on_var_text: Vec<bool>,
}

impl RoutingTrace {
    /// Positions per layer.
    pub fn positions(&self) -> usize {
        self.shared.len() / self.layers.len().max(1)
    }

    /// Mean over layers and the first `h` positions of `shared / k`; `on_reference_text` picks
    /// the text.
    pub fn overlap(&self, h: usize, on_reference_text: bool) -> f64 {
        let shared = if on_reference_text { &self.shared } else { &self.shared_on_var_text };
        let n = self.positions();
        let sum: u64 = shared.chunks(n.max(1)).flat_map(|row| &row[..h]).map(|&s| u64::from(s)).sum();
        sum as f64 / (f64::from(self.top_k) * (self.layers.len() * h) as f64)
    }

    /// Share of (layer, position < `h`) pairs whose top-1 expert differs.
    pub fn flip_rate(&self, h: usize, on_reference_text: bool) -> f64 {
        let top1 = if on_reference_text { &self.top1 } else { &self.top1_on_var_text };
        let n = self.positions();
        let flips = top1.chunks(n.max(1)).flat_map(|row| &row[..h]).filter(|&&same| !same).count();
        flips as f64 / (self.layers.len() * h) as f64
    }

    /// Layer `l`'s (by index into [`RoutingTrace::layers`]) top-1 agreement on the reference's
    /// text, `[H]`.
    pub fn layer_top1(&self, l: usize) -> &[bool] {
        let n = self.positions();
        &self.top1[l * n..(l + 1) * n]
    }

    /// Layer `l`'s overlap and flip rate over the first `h` positions of the reference's text.
    pub fn layer_rates(&self, l: usize, h: usize) -> (f64, f64) {
        let n = self.positions();
        let shared: u64 = self.shared[l * n..l * n + h].iter().map(|&s| u64::from(s)).sum();
        let flips = self.layer_top1(l)[..h].iter().filter(|&&same| !same).count();
        (shared as f64 / (f64::from(self.top_k) * h as f64), flips as f64 / h as f64)
    }

    /// Per position, whether every layer's top-1 expert agrees on the reference's text, `[H]`.
    pub fn all_layers_agree(&self) -> Vec<bool> {
        let n = self.positions();
        (0..n).map(|t| (0..self.layers.len()).all(|l| self.top1[l * n + t])).collect()
    }
}

impl Trace {
    /// An empty trace for `h` positions.
    pub fn new(ref_tokens: Vec<u32>, var_tokens: Vec<u32>) -> Trace {
        let h = ref_tokens.len();
        Trace {
            ref_tokens,
            var_tokens,
            kld: vec![0.0; h],
            kld_reverse: vec![0.0; h],
            accept: vec![0.0; h],
            top_k: vec![TopKAgreement { shared: [0; TOP_K], ref_top1_rank: TOP_K as u8 }; h],
            top1: vec![false; h],
            logp_ref: vec![0.0; h],
            logp_var: vec![0.0; h],
            ref_entropy: vec![0.0; h],
            logp_ref_on_var_text: vec![0.0; h],
            routing: None,
        }
    }

    /// Token-match rate over the first `h` positions.
    pub fn token_match_rate(&self, h: usize) -> f64 {
        qdrift_score::token_match_rate(&self.ref_tokens, &self.var_tokens, h).unwrap_or(f64::NAN)
    }

    /// KL divergence at position `t`, in f64. KL is ≥ 0; a negative f32 value is rounding of two
    /// nearly identical distributions and counts as 0.
    pub fn kld_at(&self, t: usize) -> f64 {
        f64::from(self.kld[t]).max(0.0)
    }

    /// Mean KL divergence over the first `h` positions.
    pub fn mean_kld(&self, h: usize) -> f64 {
        (0..h).map(|t| self.kld_at(t)).sum::<f64>() / h as f64
    }

    /// Reverse KL divergence at position `t`, in f64, negative rounding counted as 0 (as
    /// [`Trace::kld_at`]).
    pub fn kld_reverse_at(&self, t: usize) -> f64 {
        f64::from(self.kld_reverse[t]).max(0.0)
    }

    /// Mean reverse KL divergence over the first `h` positions.
    pub fn mean_kld_reverse(&self, h: usize) -> f64 {
        (0..h).map(|t| self.kld_reverse_at(t)).sum::<f64>() / h as f64
    }

    /// Mean speculative-sampling acceptance over the first `h` positions, each clamped to
    /// `[0, 1]` (f32 sums can pass 1 by rounding).
    pub fn mean_acceptance(&self, h: usize) -> f64 {
        self.accept[..h].iter().map(|&a| f64::from(a).clamp(0.0, 1.0)).sum::<f64>() / h as f64
    }

    /// Mean top-`k` overlap over the first `h` positions; `None` where a position's is unknown
    /// (a compact reference that kept fewer than `k` tokens).
    pub fn top_k_overlap(&self, h: usize, k: usize) -> Option<f64> {
        let sum = self.top_k[..h].iter().map(|a| a.overlap(k)).sum::<Option<f64>>()?;
        Some(sum / h as f64)
    }

    /// Share of the first `h` positions where the reference's top-1 is in the variant's top `k`.
    pub fn ref_top1_in_top(&self, h: usize, k: usize) -> f64 {
        self.top_k[..h].iter().filter(|a| a.ref_top1_in_top(k)).count() as f64 / h as f64
    }

    /// Share of the first `h` positions whose top-1 agrees.
    pub fn top1_agreement(&self, h: usize) -> f64 {
        self.top1[..h].iter().filter(|&&a| a).count() as f64 / h as f64
    }

    /// Root mean square of `p_var(ref token) − p_ref(ref token)` over the first `h` positions.
    pub fn rms_delta_p(&self, h: usize) -> f64 {
        let ss: f64 = (0..h)
            .map(|t| {
                let d = f64::from(self.logp_var[t]).exp() - f64::from(self.logp_ref[t]).exp();
                d * d
            })
            .sum();
        (ss / h as f64).sqrt()
    }

    /// The first `h` values of `v`, summed in f64.
    pub(crate) fn sum(v: &[f32], h: usize) -> f64 {
        v[..h].iter().map(|&x| f64::from(x)).sum()
    }

    /// The reference text's log-probabilities under both models, first `h` positions.
    pub fn ppl_on_reference_text(&self, h: usize) -> PromptLogProbs {
        PromptLogProbs { tokens: h, sum_ref: Self::sum(&self.logp_ref, h), sum_var: Self::sum(&self.logp_var, h) }
    }

    /// The reference's log-probabilities of its own text (`sum_ref`) and of the variant's
    /// (`sum_var`), first `h` positions: their pooled ratio is the PPL drift of generated text.
    pub fn ppl_of_generated_text(&self, h: usize) -> PromptLogProbs {
        PromptLogProbs {
            tokens: h,
            sum_ref: Self::sum(&self.logp_ref, h),
            sum_var: Self::sum(&self.logp_ref_on_var_text, h),
        }
    }
}

/// The reference's compact statistics on its own text, for every prompt.
#[derive(Clone, Debug, PartialEq)]
pub struct CompactReference {
    /// Tokens kept per position.
    pub k: usize,
    /// One entry per prompt, in prompt order: a chunk of one row (`batch` 1) holding every
    /// position of the prompt's continuation.
    pub prompts: Vec<CompactChunk>,
}
