//! The report from a measurement: every variant's traces reduced to their statistics
//! ([`crate::assemble::aggregate`]), beside the run's context; the one path both an unsharded run
//! (`run/evaluate.rs`) and the merge of a sharded run's parts (`persist/shard.rs`) take.
//!
//! **Invariant: the report depends only on the measurement and the context, so a run and the
//! merge of its shards give the same bytes.**

use qdrift_report::{KlMethod, Report, SCHEMA_VERSION, Variant};

use crate::assemble::aggregate::{self, Bootstrap, Trace};
use crate::assemble::routing_drift;
use crate::error::EvalError;
use crate::types::{Measurement, RunContext, TailSums, VariantHeader};

/// The statistics of a measurement, as the report's variants and the reference's
/// self-perplexity and KL method.
///
/// # Shapes
/// Every variant's traces: one per prompt, in prompt order, `max(horizons)` positions each.
fn summarize_all(context: &mut RunContext, measurement: Measurement) -> Result<Vec<Variant>, EvalError> {
    let w = &context.workload;
    let (horizons, bootstrap) = (w.horizons.clone(), Bootstrap { resamples: w.bootstrap_resamples, seed: w.seed });
    let longest = horizons.last().copied().unwrap_or(0);
    // A failed variant has no traces: neither the noise floor's excess nor anything else.
    let ran = |v: &&(VariantHeader, Vec<Trace>)| v.0.failure.is_none();
    let noise_floor = measurement.variants.first().filter(ran).map(|(_, t)| t.clone());
    if let Some((_, traces)) = measurement.variants.iter().find(ran) {
        // Every variant's traces hold the reference's log p on its own text; the first that
        // ran (the noise floor, unless it failed) serve.
        context.reference.self_perplexity =
            horizons.iter().map(|&h| (h, aggregate::self_perplexity(traces, h))).collect();
    }
    context.reference.kl = Some(match &measurement.tail {
        Some((k, sums)) => {
            let tail = TailSums::total(sums);
            KlMethod::TopKTail { top_k: *k, tail_mass_max: tail.max, tail_mass_mean: tail.mean }
        }
        None => KlMethod::Exact,
    });
    let mut variants = Vec::with_capacity(measurement.variants.len());
    let eos = context.model.stop_token_id;
    for (i, (header, traces)) in measurement.variants.into_iter().enumerate() {
        let floor = if i == 0 { None } else { noise_floor.as_deref() };
        variants.push(summarize(header, &traces, floor, &horizons, (bootstrap, eos), longest)?);
    }
    Ok(variants)
}

/// A variant's entry in the report: its description and the statistics of its traces, paired
/// with the noise floor's (`None` for the noise floor itself).
fn summarize(
    header: VariantHeader,
    traces: &[Trace],
    noise_floor: Option<&[Trace]>,
    horizons: &[usize],
    (bootstrap, eos): (Bootstrap, Option<u32>),
    longest: usize,
) -> Result<Variant, EvalError> {
    if header.failure.is_some() {
        return Ok(described(header));
    }
    let mut metrics = aggregate::horizon_metrics(traces, noise_floor, horizons, bootstrap)?;
    if let Some(eos) = eos {
        aggregate::set_stopping_metrics(&mut metrics, traces, eos, bootstrap)?;
    }
    routing_drift::set_horizon_metrics(&mut metrics, traces, bootstrap)?;
    Ok(Variant {
        horizons: metrics,
        first_divergence: aggregate::first_divergence_summary(traces, longest)?,
        per_position: aggregate::per_position(traces, longest),
        entropy_strata: aggregate::entropy_strata(traces, longest)?,
        routing: routing_drift::routing_drift(traces, longest, bootstrap)?,
        ..described(header)
    })
}

/// A variant's entry from its header alone: what it is, its failure if it failed, and empty
/// statistics.
fn described(header: VariantHeader) -> Variant {
    Variant {
        recipe: header.recipe,
        name: header.name,
        scheme: header.scheme,
        path: header.path,
        sha256: header.sha256,
        files: header.files,
        kind: header.kind,
        compute_dtype: header.compute_dtype,
        bits_per_weight: header.bits_per_weight,
        weight_bytes: header.weight_bytes,
        horizons: Vec::new(),
        first_divergence: qdrift_report::FirstDivergence {
            median: None,
            survival: Vec::new(),
            censored: 0,
            positions: Vec::new(),
        },
        per_position: qdrift_report::PerPosition {
            token_match: Vec::new(),
            kld: Vec::new(),
            top1_agreement: Vec::new(),
        },
        entropy_strata: Vec::new(),
        per_tensor_error: header.per_tensor_error,
        routing: None,
        failure: header.failure,
        different_model: header.different_model,
    }
}

/// The report: the model, the workload, the reference and the measured variants' statistics;
/// validated.
pub(crate) fn assemble_report(mut context: RunContext, measurement: Measurement) -> Result<Report, EvalError> {
    let variants = summarize_all(&mut context, measurement)?;
    let report = Report {
        schema_version: SCHEMA_VERSION,
        model: context.model,
        workload: context.workload,
        reference: context.reference,
        variants,
    };
    report.validate()?;
    Ok(report)
}
