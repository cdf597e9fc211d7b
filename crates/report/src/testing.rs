//! Test support: a realistic, deterministic report (no random numbers, no I/O).
//!
//! [`sample_report`] stands in for the output of `qdrift eval` on a small Llama: a noise floor
//! and two schemes over 72 prompts and horizons 10/100/1000. Its numbers are made up but
//! consistent with each other (horizon means are means of the per-position curves, the survival
//! curve is the Kaplan–Meier estimate of the listed first-divergence positions, the median is its
//! median), so renderers and the gate see the shapes real reports have.
//!
//! [`sample_moe_report`] is the same run on a model with experts: every variant also has its
//! routing drift ([`RoutingDrift`]) and the four per-horizon routing metrics, which a dense
//! model's report (the [`sample_report`]) lacks.

use crate::metrics::{METRICS, Metric, Range};
use crate::{
    Distribution, EntropyStratum, Estimate, EvalSetInfo, FirstDivergence, HorizonMetrics, KlMethod, LayerRouting,
    ModelInfo, ModelShape, PerPosition, Reference, Report, RoutingDrift, SCHEMA_VERSION, TensorError, Variant,
    VariantKind, Workload,
};

const PROMPTS: usize = 72;
const HORIZONS: [usize; 3] = [10, 100, 1000];

/// How one made-up variant diverges.
struct Profile {
    name: &'static str,
    kind: VariantKind,
    scheme: Option<&'static str>,
    compute_dtype: &'static str,
    bits_per_weight: f64,
    /// Mean first-divergence position (exponential decay of the survival curve).
    tau: f64,
    /// Typical per-position KLD in nats.
    kld: f64,
    /// Typical SQNR of the quantized tensors (`None`: no quantized tensors).
    sqnr_db: Option<f64>,
    /// For [`sample_moe_report`]: share of (position, mixture-of-experts layer) pairs whose top-1
    /// expert differs from the reference's.
    flip_rate: f64,
    /// For [`sample_moe_report`]: mean position of a prompt's first routing flip in any layer.
    tau_flip: f64,
}

const PROFILES: [Profile; 3] = [
    Profile {
        name: "noise-floor-f32",
        kind: VariantKind::NoiseFloor,
        scheme: None,
        compute_dtype: "f32",
        bits_per_weight: 16.0,
        tau: 2500.0,
        kld: 2.0e-4,
        sqnr_db: None,
        flip_rate: 0.002,
        tau_flip: 4000.0,
    },
    Profile {
        name: "int8",
        kind: VariantKind::Scheme,
        scheme: Some("int8"),
        compute_dtype: "f16",
        bits_per_weight: 8.5,
        tau: 420.0,
        kld: 3.0e-3,
        sqnr_db: Some(41.0),
        flip_rate: 0.03,
        tau_flip: 35.0,
    },
    Profile {
        name: "int4-g128",
        kind: VariantKind::Scheme,
        scheme: Some("int4-g128"),
        compute_dtype: "f16",
        bits_per_weight: 4.125,
        tau: 45.0,
        kld: 4.0e-2,
        sqnr_db: Some(19.5),
        flip_rate: 0.14,
        tau_flip: 6.0,
    },
];

/// A realistic report: `noise-floor-f32` (kind `noise_floor`), `int8` and `int4-g128` (kind
/// `scheme`), 72 prompts, horizons 10/100/1000, per-position curves of length 1000.
pub fn sample_report() -> Report {
    let horizon_max = HORIZONS[HORIZONS.len() - 1];
    let curves: Vec<Curves> = PROFILES.iter().map(|p| Curves::new(p, horizon_max)).collect();
    let variants = PROFILES.iter().zip(&curves).map(|(p, c)| variant(p, c, &curves[0])).collect();
    Report {
        schema_version: SCHEMA_VERSION,
        model: ModelInfo {
            path: "model.safetensors".into(),
            sha256: "3f5c0b1e9d2a4c6b8e0f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f".into(),
            architecture: "llama".into(),
            parameters: 134_515_008,
            synthetic: false,
            format: "hf-safetensors".into(),
            shape: ModelShape { layers: 30, dim: 576, hidden_dim: 1536, heads: 9, kv_heads: 3, vocab_size: 49152 },
            stop_token_id: Some(2),
            stored_dtype: None,
        },
        workload: Workload {
            backend: "wgpu".into(),
            adapter: "llvmpipe (LLVM 19.1.7, 256 bits)".into(),
            compute_dtype: "f16".into(),
            prompts: PROMPTS,
            horizons: HORIZONS.to_vec(),
            batch_size: 8,
            seed: 42,
            eval_set: EvalSetInfo {
                path: "stories.jsonl (built in)".into(),
                sha256: "9a8b7c6d5e4f30211203f4e5d6c7b8a99a8b7c6d5e4f30211203f4e5d6c7b8a9".into(),
                prompts: (0..PROMPTS).map(|i| format!("stories-{i:03}")).collect(),
            },
            qdrift_version: "0.1.0".into(),
            bootstrap_resamples: 1000,
            chat_template: false,
            quantize_router: Some(false),
        },
        reference: Reference {
            name: "fp16".into(),
            compute_dtype: "f16".into(),
            weight_bytes: 269_030_016,
            self_perplexity: vec![(10, 3.12), (100, 2.41), (1000, 1.93)],
            kl: Some(KlMethod::TopKTail { top_k: 64, tail_mass_max: 0.031, tail_mass_mean: 0.004 }),
        },
        variants,
    }
}

/// The per-prompt and per-position data a variant's summaries are computed from.
struct Curves {
    /// Each prompt's first-divergence position (`horizon_max` when it never diverged).
    first_divergence: Vec<usize>,
    token_match: Vec<f64>,
    kld: Vec<f64>,
    top1: Vec<f64>,
}

/// A deterministic wobble in [-1, 1] (no random numbers: same input → same report).
fn wobble(i: usize, salt: f64) -> f64 {
    // The classic shader hash: the fractional part of a large multiple of a sine.
    let x = ((i as f64 + 1.0) * 12.9898 + salt * 78.233).sin() * 43758.5453;
    2.0 * (x - x.floor()) - 1.0
}

/// Exponential first-event positions of mean `tau` at evenly spaced quantiles (prompt `i` at the
/// `(i + 0.5) / n` quantile); `horizon_max` for a prompt whose event comes later (censored).
fn exponential_positions(tau: f64, horizon_max: usize) -> Vec<usize> {
    (0..PROMPTS)
        .map(|i| {
            let u = (i as f64 + 0.5) / PROMPTS as f64;
            let t = (-tau * u.ln()).floor();
            if t >= horizon_max as f64 { horizon_max } else { t as usize }
        })
        .collect()
}

impl Curves {
    /// The made-up curves of profile `p` over `horizon_max` positions.
    fn new(p: &Profile, horizon_max: usize) -> Curves {
        let first_divergence = exponential_positions(p.tau, horizon_max);
        let n = PROMPTS as f64;
        let token_match = (0..horizon_max)
            .map(|t| {
                let identical = first_divergence.iter().filter(|&&d| d > t).count() as f64;
                // After diverging, a continuation still agrees with the reference now and then.
                let rejoined = ((n - identical) * 0.12).round();
                ((identical + rejoined) / n).min(1.0)
            })
            .collect();
        let kld: Vec<f64> = (0..horizon_max)
            .map(|t| p.kld * (1.0 + 0.6 * (-(t as f64) / 40.0).exp()) * (1.0 + 0.25 * wobble(t, p.tau)))
            .collect();
        let top1 = kld.iter().map(|&k| (1.0 - 0.9 * k.sqrt()).clamp(0.0, 1.0)).collect();
        Curves { first_divergence, token_match, kld, top1 }
    }
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() { 0.0 } else { xs.iter().sum::<f64>() / xs.len() as f64 }
}

/// A mean with a symmetric interval of half-width `half`, clipped to `[lo, hi]`.
fn ci(m: f64, half: f64, lo: f64, hi: f64) -> Estimate {
    Estimate::new(m, [(m - half).max(lo), (m + half).min(hi)])
}

/// The `q` quantile of sorted `xs` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The metrics of curves `c` over the first `h` positions (the excess against `floor` unless
/// the variant is the noise floor).
fn horizon(h: usize, c: &Curves, floor: &Curves, is_floor: bool) -> HorizonMetrics {
    let n = PROMPTS as f64;
    let tm = mean(&c.token_match[..h]);
    let tm_half = 1.96 * (tm * (1.0 - tm) / n).sqrt() + 0.002;
    let exact = c.first_divergence.iter().filter(|&&d| d >= h).count() as f64 / n;
    let exact_half = 1.96 * (exact * (1.0 - exact) / n).sqrt() + 0.01;
    let mut sorted = c.kld[..h].to_vec();
    sorted.sort_by(f64::total_cmp);
    let kld_mean = mean(&sorted);
    let top1 = mean(&c.top1[..h]);
    let drift = 1.0 + (1.0 - exact) * 40.0 * kld_mean.sqrt() * 0.1;
    let kld = Estimate {
        mean: kld_mean,
        distribution: Some(Distribution {
            median: quantile(&sorted, 0.5),
            p90: quantile(&sorted, 0.9),
            p99: quantile(&sorted, 0.99),
            max: sorted.last().copied().unwrap_or(0.0),
        }),
        ci95: [kld_mean * 0.86, kld_mean * 1.15],
    };
    let mut metrics = vec![
        ("token_match_rate", ci(tm, tm_half, 0.0, 1.0)),
        ("exact_match_fraction", ci(exact, exact_half, 0.0, 1.0)),
        ("kld", kld),
        ("top1_agreement", ci(top1, 0.25 * (1.0 - top1) + 0.001, 0.0, 1.0)),
        ("rms_delta_p", ci(0.35 * kld_mean.sqrt(), 0.05 * kld_mean.sqrt(), 0.0, 1.0)),
        ("ppl_ratio_on_reference_text", ci(1.0 + 1.2 * kld_mean, 0.3 * kld_mean, 0.0, f64::MAX)),
        ("ppl_drift_of_generated_text", ci(drift, 0.4 * (drift - 1.0) + 0.003, 0.0, f64::MAX)),
    ];
    if !is_floor {
        let d_tm = tm - mean(&floor.token_match[..h]);
        let d_kld = kld_mean - mean(&floor.kld[..h]);
        metrics.push(("excess_token_match_rate", ci(d_tm, tm_half * 1.1, f64::MIN, f64::MAX)));
        metrics.push(("excess_kld", ci(d_kld, 0.15 * d_kld.abs() + 1e-5, f64::MIN, f64::MAX)));
    }
    let mut out = HorizonMetrics::new(h);
    for (name, value) in metrics {
        out.set(name, value).expect("every name is in METRICS");
    }
    let unmodelled: Vec<&Metric> = METRICS
        .iter()
        .filter(|m| out.get(m).is_none() && !(is_floor && m.is_excess()) && !ROUTING_METRICS.contains(&m.name))
        .collect();
    for m in unmodelled {
        out.set(m.name, placeholder(m)).expect("a name of METRICS");
    }
    set_pooled_quantiles(&mut out);
    out
}

/// Each pooled quantile (`kld_p99`, …) set to its metric's distribution's, with an interval
/// within the largest value, as a run writes it.
fn set_pooled_quantiles(h: &mut HorizonMetrics) {
    let tails: Vec<(&str, Distribution)> = h.iter().filter_map(|(m, e)| Some((m.name, e.distribution?))).collect();
    for (name, d) in tails {
        for (suffix, q) in d.quantiles() {
            let key = format!("{name}_{suffix}");
            if h.metric(&key).is_some() {
                h.set(&key, Estimate::new(q, [0.9 * q, (1.1 * q).min(d.max)])).expect("a name of METRICS");
            }
        }
    }
}

/// The per-horizon metrics of a model with experts: a dense model's report has none of them.
const ROUTING_METRICS: [&str; 4] =
    ["expert_overlap", "routing_flip_rate", "expert_overlap_on_generated_text", "routing_flip_rate_on_generated_text"];

/// A value in the range of a metric the sample does not model (one added to [`METRICS`] after
/// it was written), so that the renderings and the gate tests still see every metric.
fn placeholder(m: &Metric) -> Estimate {
    let (mean, ci95) = match m.range {
        Range::Unit => (0.5, [0.4, 0.6]),
        Range::NonNegative | Range::Positive => (1.0, [0.9, 1.1]),
        Range::Any => (0.0, [-0.1, 0.1]),
    };
    let distribution = m.tail.map(|_| Distribution { median: mean, p90: mean, p99: mean, max: mean });
    Estimate { mean, distribution, ci95 }
}

/// The Kaplan–Meier curve of first-event positions (first divergences, first routing flips), as
/// the evaluation writes it: an event at position `d < horizon_max` is an event at `t = d + 1`,
/// `S(t)` is the share of prompts with no event in their first `t` tokens (`d ≥ t`), and the
/// median is `t − 1` for the first `t` with `S(t) ≤ 0.5`.
fn kaplan_meier(positions: &[usize], horizon_max: usize) -> FirstDivergence {
    let n = positions.len() as f64;
    let mut events: Vec<usize> = positions.iter().filter(|&&d| d < horizon_max).map(|&d| d + 1).collect();
    events.sort_unstable();
    events.dedup();
    let still = |t: usize| positions.iter().filter(|&&d| d >= t).count() as f64 / n;
    let mut survival = vec![(0, 1.0)];
    survival.extend(events.iter().map(|&t| (t, still(t))));
    let median = survival.iter().find(|&&(_, s)| s <= 0.5).map(|&(t, _)| t - 1);
    let censored = positions.iter().filter(|&&d| d >= horizon_max).count();
    FirstDivergence { median, survival, censored, positions: positions.to_vec() }
}

/// One made-up variant of profile `p` (dense: no routing).
fn variant(p: &Profile, c: &Curves, floor: &Curves) -> Variant {
    let horizon_max = HORIZONS[HORIZONS.len() - 1];
    let is_floor = p.kind == VariantKind::NoiseFloor;
    let k = p.kld;
    let entropy_strata = [(0.0, 0.45, 0.2), (0.45, 1.38, 0.7), (1.38, 2.61, 1.4), (2.61, 7.93, 2.9)]
        .iter()
        .map(|&(lo, hi, scale)| EntropyStratum {
            entropy_lo: lo,
            entropy_hi: hi,
            positions: PROMPTS * horizon_max / 4,
            kld_mean: Some(k * scale),
            top1_agreement: Some((1.0 - 2.5 * (k * scale).sqrt()).clamp(0.0, 1.0)),
        })
        .collect();
    let per_tensor_error = match p.sqnr_db {
        None => Vec::new(),
        Some(sqnr) => [
            ("model.embed_tokens.weight", 1.5),
            ("model.layers.0.self_attn.q_proj.weight", -0.8),
            ("model.layers.0.mlp.down_proj.weight", -2.1),
            ("model.layers.29.self_attn.v_proj.weight", 0.4),
            ("model.layers.29.mlp.gate_proj.weight", -0.3),
        ]
        .iter()
        .map(|&(name, offset)| {
            let db: f64 = sqnr + offset;
            let rel = 10f64.powf(-db / 20.0);
            TensorError {
                tensor: name.into(),
                sqnr_db: Some(db),
                rel_frobenius: rel,
                cosine: (1.0 - rel * rel / 2.0).clamp(-1.0, 1.0),
            }
        })
        .chain(std::iter::once(TensorError {
            // Norm weights are kept in FP16 and reconstructed exactly.
            tensor: "model.norm.weight".into(),
            sqnr_db: None,
            rel_frobenius: 0.0,
            cosine: 1.0,
        }))
        .collect(),
    };
    Variant {
        failure: None,
        different_model: None,
        name: p.name.into(),
        scheme: p.scheme.map(Into::into),
        recipe: None,
        path: None,
        sha256: None,
        files: Vec::new(),
        kind: p.kind,
        compute_dtype: p.compute_dtype.into(),
        bits_per_weight: p.bits_per_weight,
        weight_bytes: (134_515_008.0 * p.bits_per_weight / 8.0) as u64,
        horizons: HORIZONS.iter().map(|&h| horizon(h, c, floor, is_floor)).collect(),
        first_divergence: kaplan_meier(&c.first_divergence, horizon_max),
        per_position: PerPosition {
            token_match: c.token_match.clone(),
            kld: c.kld.clone(),
            top1_agreement: c.top1.clone(),
        },
        entropy_strata,
        per_tensor_error,
        routing: None,
    }
}

/// The mixture-of-experts layers of [`sample_moe_report`] (blocks of the 30) and how much more
/// often than the mean each flips: the deeper a layer, the more quantization error its router
/// sees.
const MOE_LAYERS: [(usize, f64); 3] = [(0, 0.7), (15, 1.0), (29, 1.3)];

/// [`sample_report`] on a model with experts (8 experts per layer, top-2 routing, three
/// mixture-of-experts layers): every variant also has a [`RoutingDrift`] and the four per-horizon
/// routing metrics, flips rising with quantization strength and near 0 on the noise floor.
/// Consistent like the rest: the per-horizon flip rate is the mean of `flip_by_position` over
/// the horizon, the first flip's curve is the Kaplan–Meier estimate of its positions.
pub fn sample_moe_report() -> Report {
    let mut r = sample_report();
    r.model.architecture = "mixtral".into();
    let horizon_max = HORIZONS[HORIZONS.len() - 1];
    for (v, p) in r.variants.iter_mut().zip(&PROFILES) {
        let routing = routing(p, horizon_max);
        for h in &mut v.horizons {
            for (name, value) in routing_metrics(&routing.flip_by_position[..h.tokens]) {
                h.set(name, value).expect("a name of METRICS");
            }
        }
        v.routing = Some(routing);
    }
    r
}

/// `1 − 0.6 · flips`: the share of the top-2 experts two routers still share when a share
/// `flips` of their top-1 choices differ (a flipped top-1 often stays in the other's top 2).
fn overlap_of(flips: f64) -> f64 {
    1.0 - 0.6 * flips
}

/// The four per-horizon routing metrics of the per-position flip shares `flips` of a horizon;
/// on the variant's own text routers disagree a quarter more.
fn routing_metrics(flips: &[f64]) -> [(&'static str, Estimate); 4] {
    let f = mean(flips);
    let g = (1.25 * f).min(1.0);
    let flip = |f: f64| ci(f, 0.25 * f + 5e-4, 0.0, 1.0);
    let overlap = |f: f64| ci(overlap_of(f), 0.15 * f + 5e-4, 0.0, 1.0);
    [
        ("expert_overlap", overlap(f)),
        ("routing_flip_rate", flip(f)),
        ("expert_overlap_on_generated_text", overlap(g)),
        ("routing_flip_rate_on_generated_text", flip(g)),
    ]
}

/// Profile `p`'s routing drift over `horizon_max` positions.
fn routing(p: &Profile, horizon_max: usize) -> RoutingDrift {
    let flip_by_position: Vec<f64> =
        (0..horizon_max).map(|t| (p.flip_rate * (1.0 + 0.3 * wobble(t, p.tau_flip))).clamp(0.0, 1.0)).collect();
    let f = mean(&flip_by_position);
    let layers = MOE_LAYERS
        .iter()
        .map(|&(layer, factor)| {
            let flips = (f * factor).min(1.0);
            // One layer flips less often than any of the three.
            let first = kaplan_meier(&exponential_positions(p.tau_flip * 3.0 / factor, horizon_max), horizon_max);
            LayerRouting {
                layer,
                flip_rate: ci(flips, 0.3 * flips + 5e-4, 0.0, 1.0),
                expert_overlap: ci(overlap_of(flips), 0.2 * flips + 5e-4, 0.0, 1.0),
                first_flip_median: first.median,
            }
        })
        .collect();
    RoutingDrift {
        experts: 8,
        top_k: 2,
        first_flip: kaplan_meier(&exponential_positions(p.tau_flip, horizon_max), horizon_max),
        flip_by_position,
        layers,
    }
}
