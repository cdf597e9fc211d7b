//! [`Report::validate`]: what makes a `report.json` one that a run of qdrift could have written.
//!
//! The gate compares numbers with thresholds; a hand-edited or corrupt report whose numbers no
//! run can produce (a negative divergence, a mean outside its own interval, a survival curve
//! that rises) would otherwise pass it. Each rule below holds for every report `qdrift eval`
//! writes (the producer validates before writing, so it can never write a report its own gate
//! refuses), and each refusal is one line naming the variant, the metric and horizon, and the
//! problem.

use std::collections::BTreeSet;

use crate::metrics::{Range, metric, slack};
use crate::{
    Estimate, FirstDivergence, LayerRouting, PerPosition, Report, ReportError, RoutingDrift, SCHEMA_VERSION,
    TensorError, Variant,
};

impl Report {
    /// Checks that the report is one a run can produce:
    /// - every metric's numbers in its range of [`METRICS`](crate::metrics::METRICS), its interval
    ///   ordered and containing its mean, its distribution ordered (`median ≤ p90 ≤ p99 ≤ max`)
    ///   ([`Metric::check`](crate::Metric::check));
    /// - horizons ascending and the same in every variant, variant names unique;
    /// - the counts those of the workload: `eval_set.prompts` and `first_divergence.positions`
    ///   hold one entry per prompt, `censored ≤ prompts`, every position and the median within
    ///   the longest horizon;
    /// - the survival curve starting at `(0, 1)`, times ascending, values non-increasing in
    ///   `[0, 1]`;
    /// - the per-position curves `max(horizons)` long, shares in `[0, 1]`, KLD `≥ 0`;
    /// - for a model with experts (`routing`): `1 ≤ top_k ≤ experts`; `first_flip` checked as
    ///   `first_divergence` is; `flip_by_position` `max(horizons)` long, shares in `[0, 1]`;
    ///   `layers` non-empty, their indices strictly ascending, each layer's `flip_rate` and
    ///   `expert_overlap` checked as the metrics `routing_flip_rate` and `expert_overlap` are,
    ///   its `first_flip_median` within the longest horizon;
    /// - each horizon's `per_prompt` values one finite value per prompt, of a metric the horizon
    ///   has, each a value a prompt can have ([`PerPrompt::admits`](crate::PerPrompt::admits): a
    ///   rate in `[0, 1]`, a KL divergence `≥ 0`, steps a whole number from 1 to `h`), giving
    ///   the metric's estimate through its [`PerPrompt`](crate::PerPrompt) statistic, and for a
    ///   metric with a distribution none above its largest position value (a prompt's mean over
    ///   its positions cannot exceed them). No KL divergence may be negative, not even by
    ///   rounding: the evaluation counts a position's negative f32 rounding as 0
    ///   (`qdrift_eval`'s `Trace::kld_at`), so a run never writes one, and a tolerance would only
    ///   let an edited report through;
    /// - a pooled quantile (`kld_median`, `kld_p90`, `kld_p99` and the reverse KLD's) equal, up to
    ///   rounding, to the same quantile of its metric's distribution (the same type-7 quantile of
    ///   the same positions: the number the tables show as `KLD p99`), its interval within the
    ///   largest position value (a resample holds only the run's positions);
    /// - `bits_per_weight` finite and `≥ 0`, every other number finite and in its range.
    ///
    /// The error is [`ReportError::Invalid`] with one line; [`Report::read`] adds the file.
    pub fn validate(&self) -> Result<(), ReportError> {
        self.check().map_err(ReportError::Invalid)
    }

    fn check(&self) -> Result<(), String> {
        if self.schema_version != SCHEMA_VERSION {
            return Err(format!("schema_version {}", self.schema_version));
        }
        let w = &self.workload;
        let horizons = &w.horizons;
        if horizons.is_empty() || horizons[0] == 0 || !horizons.windows(2).all(|p| p[0] < p[1]) {
            return Err(format!("horizons {horizons:?} are not ascending and positive"));
        }
        if w.prompts == 0 {
            return Err("workload.prompts = 0: a report covers at least one prompt".into());
        }
        if w.eval_set.prompts.len() != w.prompts {
            return Err(format!("eval_set.prompts has {} ids for {} prompts", w.eval_set.prompts.len(), w.prompts));
        }
        if let Some(eos) = self.model.stop_token_id
            && eos as usize >= self.model.shape.vocab_size
        {
            return Err(format!("model.stop_token_id {eos} is not below vocab_size {}", self.model.shape.vocab_size));
        }
        for &(h, ppl) in &self.reference.self_perplexity {
            in_range(&format!("reference self_perplexity at horizon {h}"), ppl, Range::Positive)?;
        }
        let mut names = BTreeSet::new();
        for v in &self.variants {
            if !names.insert(v.name.as_str()) {
                return Err(format!("two variants are named {}", v.name));
            }
            v.check(horizons, w.prompts).map_err(|what| format!("variant {}: {what}", v.name))?;
        }
        Ok(())
    }
}

/// `Err("WHAT = X, not RANGE")` unless `x` is in `range`.
fn in_range(what: &str, x: f64, range: Range) -> Result<(), String> {
    if range.contains(x) { Ok(()) } else { Err(format!("{what} = {x}, not {}", range.describe())) }
}

impl Variant {
    /// [`Report::validate`] for one variant: the error says what is wrong, without the name.
    fn check(&self, horizons: &[usize], prompts: usize) -> Result<(), String> {
        if let Some(f) = &self.failure {
            // A failed variant: one line, and no statistics.
            if f.is_empty() || f.contains('\n') {
                return Err("failure is not one line".into());
            }
            let empty = self.horizons.is_empty()
                && self.first_divergence.positions.is_empty()
                && self.per_position.token_match.is_empty()
                && self.entropy_strata.is_empty()
                && self.routing.is_none();
            return if empty { Ok(()) } else { Err("failed, but has statistics".into()) };
        }
        let hs: Vec<usize> = self.horizons.iter().map(|h| h.tokens).collect();
        if hs != horizons {
            return Err(format!("horizons {hs:?} ≠ workload {horizons:?}"));
        }
        in_range("bits_per_weight", self.bits_per_weight, Range::NonNegative)?;
        let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if let Some(h) = self.sha256.as_deref().filter(|h| !hex(h)) {
            return Err(format!("sha256 {:?} is not 64 lowercase hex digits", crate::format::plain(h)));
        }
        if let Some(f) = self.files.iter().find(|f| !hex(&f.sha256)) {
            return Err(format!(
                "files: {:?} has a sha256 that is not 64 lowercase hex digits",
                crate::format::plain(&f.name)
            ));
        }
        if !self.files.is_empty() && self.sha256.is_none() {
            return Err("files are listed without the folder's sha256".into());
        }
        for h in &self.horizons {
            let at = |why: String| format!("{why} at horizon {}", h.tokens);
            for (m, e) in h.iter() {
                m.check(e).map_err(at)?;
            }
            check_per_prompt(h, prompts).map_err(at)?;
            check_pooled_quantiles(h).map_err(at)?;
        }
        let longest = horizons[horizons.len() - 1];
        self.first_divergence.check("first_divergence", prompts, longest)?;
        self.per_position.check(longest)?;
        self.routing.as_ref().map_or(Ok(()), |r| r.check(prompts, longest))?;
        for s in &self.entropy_strata {
            in_range("entropy_strata entropy_lo", s.entropy_lo, Range::NonNegative)?;
            in_range("entropy_strata entropy_hi", s.entropy_hi, Range::NonNegative)?;
            s.kld_mean.map_or(Ok(()), |x| in_range("entropy_strata kld_mean", x, Range::NonNegative))?;
            s.top1_agreement.map_or(Ok(()), |x| in_range("entropy_strata top1_agreement", x, Range::Unit))?;
        }
        self.per_tensor_error.iter().try_for_each(TensorError::check)
    }
}

/// A horizon's per-prompt values: one finite value per prompt, each one a prompt can have, for a
/// metric the horizon has, whose [`PerPrompt`](crate::PerPrompt) statistic is the metric's
/// estimate (to 1e-9 relative: the sums run in another order, and a float read back may be one
/// ulp off), none above the metric's largest position value.
fn check_per_prompt(h: &crate::HorizonMetrics, prompts: usize) -> Result<(), String> {
    for (name, values) in h.per_prompt_values() {
        if values.len() != prompts {
            return Err(format!("per_prompt.{name} has {} values for {prompts} prompts", values.len()));
        }
        if let Some(i) = values.iter().position(|v| !v.is_finite()) {
            return Err(format!("per_prompt.{name} value {i} is {}, not finite", values[i]));
        }
        let (Some(e), Some(m)) = (h.metric(name), metric(name)) else {
            return Err(format!("per_prompt.{name} is given without the metric"));
        };
        let Some(statistic) = m.per_prompt else {
            return Err(format!("per_prompt.{name}: {name} has no per-prompt values"));
        };
        if let Some(i) = values.iter().position(|&v| !statistic.admits(m.range, v, h.tokens)) {
            let range = statistic.describe(m.range, h.tokens);
            return Err(format!("per_prompt.{name} value {i} = {:?}, not {range}", values[i]));
        }
        let of_values = statistic.estimate(values.iter().sum::<f64>() / prompts as f64, h.tokens);
        if (of_values - e.mean).abs() > 1e-9 * e.mean.abs().max(1.0) {
            return Err(format!("per_prompt.{name} gives {of_values}, but the metric's mean is {}", e.mean));
        }
        if let Some(d) = e.distribution
            && let Some(i) = values.iter().position(|&v| v > d.max + slack(d.max))
        {
            return Err(format!(
                "per_prompt.{name} value {i} = {:?}, above {name}'s largest value over positions {:?}",
                values[i], d.max
            ));
        }
    }
    Ok(())
}

/// Each pooled quantile of a horizon (`NAME_p99` beside `NAME`'s distribution: see
/// [`Distribution::quantiles`](crate::Distribution::quantiles)) equal to the distribution's, up to
/// rounding, and its interval no higher than the distribution's largest value.
fn check_pooled_quantiles(h: &crate::HorizonMetrics) -> Result<(), String> {
    for (m, e) in h.iter() {
        let Some(d) = e.distribution else { continue };
        for (suffix, q) in d.quantiles() {
            let name = format!("{}_{suffix}", m.name);
            let Some(pooled) = h.metric(&name) else { continue };
            if (pooled.mean - q).abs() > slack(q) {
                return Err(format!(
                    "{name} = {:?}, but {}'s {suffix} over the same positions is {q:?}",
                    pooled.mean, m.name
                ));
            }
            if pooled.ci95[1] > d.max + slack(d.max) {
                return Err(format!(
                    "{name} interval {:?} reaches above {}'s largest value over positions {:?}",
                    pooled.ci95, m.name, d.max
                ));
            }
        }
    }
    Ok(())
}

impl FirstDivergence {
    /// One position per prompt, each within the longest horizon; a survival curve from `(0, 1)`
    /// that never rises. `field` is where the report holds it (`first_divergence`,
    /// `routing.first_flip`), for the messages.
    fn check(&self, field: &str, prompts: usize, longest: usize) -> Result<(), String> {
        if self.positions.len() != prompts {
            return Err(format!("{field}.positions has {} entries for {prompts} prompts", self.positions.len()));
        }
        if let Some(p) = self.positions.iter().find(|&&p| p > longest) {
            return Err(format!("{field} position {p} is past the longest horizon {longest}"));
        }
        if self.censored > prompts {
            return Err(format!("{field}.censored = {} > {prompts} prompts", self.censored));
        }
        // A prompt without an event has the longest horizon as its position.
        let never = self.positions.iter().filter(|&&p| p == longest).count();
        if self.censored != never {
            return Err(format!(
                "{field}.censored = {}, but {never} positions are the longest horizon {longest}",
                self.censored
            ));
        }
        if let Some(m) = self.median.filter(|&m| m >= longest) {
            return Err(format!("{field}.median = {m} is past the longest horizon {longest}"));
        }
        check_survival(field, &self.survival, longest)
    }
}

/// A Kaplan–Meier curve (`FIELD.survival`): `(0, 1)` first, then times ascending within
/// `longest`, values in `[0, 1]` never rising.
fn check_survival(field: &str, curve: &[(usize, f64)], longest: usize) -> Result<(), String> {
    if curve.first() != Some(&(0, 1.0)) {
        return Err(format!("{field}.survival starts at {:?}, not at (0, 1)", curve.first()));
    }
    for pair in curve.windows(2) {
        let ((t0, s0), (t1, s1)) = (pair[0], pair[1]);
        in_range(&format!("{field}.survival at t = {t1}"), s1, Range::Unit)?;
        if t1 <= t0 || t1 > longest {
            return Err(format!("{field}.survival time {t1} after {t0} (times ascend to at most {longest})"));
        }
        if s1 > s0 {
            return Err(format!("{field}.survival rises from {s0} at t = {t0} to {s1} at t = {t1}"));
        }
    }
    Ok(())
}

impl RoutingDrift {
    /// `1 ≤ top_k ≤ experts`, the first flip as a first divergence, one flip share per
    /// generated position, and one valid entry per mixture-of-experts layer, ascending.
    fn check(&self, prompts: usize, longest: usize) -> Result<(), String> {
        if self.top_k == 0 {
            return Err("routing.top_k = 0: each token is routed to at least one expert".into());
        }
        if self.experts < self.top_k {
            return Err(format!("routing.experts = {} < routing.top_k = {}", self.experts, self.top_k));
        }
        self.first_flip.check("routing.first_flip", prompts, longest)?;
        if self.flip_by_position.len() != longest {
            return Err(format!(
                "routing.flip_by_position has {} entries, not max(horizons) = {longest}",
                self.flip_by_position.len()
            ));
        }
        for (t, &x) in self.flip_by_position.iter().enumerate() {
            in_range(&format!("routing.flip_by_position at t = {t}"), x, Range::Unit)?;
        }
        if self.layers.is_empty() {
            return Err("routing.layers is empty: a model with experts has a mixture-of-experts layer".into());
        }
        for pair in self.layers.windows(2) {
            if pair[1].layer <= pair[0].layer {
                return Err(format!(
                    "routing.layers: layer {} after layer {} (layers ascend, each once)",
                    pair[1].layer, pair[0].layer
                ));
            }
        }
        self.layers.iter().try_for_each(|l| l.check(longest).map_err(|why| format!("routing layer {}: {why}", l.layer)))
    }
}

impl LayerRouting {
    /// `flip_rate` and `expert_overlap` as their metrics, the first flip's median within the
    /// longest horizon. The error names the field, not the layer.
    fn check(&self, longest: usize) -> Result<(), String> {
        as_metric("flip_rate", "routing_flip_rate", &self.flip_rate)?;
        as_metric("expert_overlap", "expert_overlap", &self.expert_overlap)?;
        match self.first_flip_median {
            Some(m) if m >= longest => Err(format!("first_flip_median = {m} is past the longest horizon {longest}")),
            _ => Ok(()),
        }
    }
}

/// Checks `e`, held in field `field`, as an estimate of the metric `name` is checked
/// ([`Metric::check`](crate::Metric::check)).
fn as_metric(field: &str, name: &str, e: &Estimate) -> Result<(), String> {
    let m = metric(name).ok_or_else(|| format!("no metric {name} to check {field} against"))?;
    m.check(e).map_err(|why| format!("{field}: {why}"))
}

impl PerPosition {
    /// Each curve one value per generated position, in its range.
    fn check(&self, longest: usize) -> Result<(), String> {
        let curves = [
            ("per_position.token_match", &self.token_match, Range::Unit),
            ("per_position.kld", &self.kld, Range::NonNegative),
            ("per_position.top1_agreement", &self.top1_agreement, Range::Unit),
        ];
        for (what, xs, range) in curves {
            if xs.len() != longest {
                return Err(format!("{what} has {} entries, not max(horizons) = {longest}", xs.len()));
            }
            for (t, &x) in xs.iter().enumerate() {
                in_range(&format!("{what} at t = {t}"), x, range)?;
            }
        }
        Ok(())
    }
}

impl TensorError {
    /// Every number finite.
    fn check(&self) -> Result<(), String> {
        in_range(&format!("{} rel_frobenius", self.tensor), self.rel_frobenius, Range::NonNegative)?;
        in_range(&format!("{} cosine", self.tensor), self.cosine, Range::Any)?;
        if !(-1.0..=1.0).contains(&self.cosine) {
            return Err(format!("{} cosine = {}, not in [-1, 1]", self.tensor, self.cosine));
        }
        self.sqnr_db.map_or(Ok(()), |s| in_range(&format!("{} sqnr_db", self.tensor), s, Range::Any))
    }
}
