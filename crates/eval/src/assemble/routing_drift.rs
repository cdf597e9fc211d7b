//! Routing drift, per-prompt [`RoutingTrace`]s → the report's statistics: the four per-horizon
//! registry metrics (`expert_overlap`, `routing_flip_rate` and their `_on_generated_text` twins)
//! and the variant's [`RoutingDrift`] (first flip, flips by position, each layer's rates).
//!
//! As everywhere in the report, prompts are the unit: a prompt's value is its mean over
//! positions and layers, and intervals are bootstrap intervals over prompts (positions and
//! layers of one prompt are far from independent: one flipped expert changes the hidden state
//! every later layer and position sees).

use qdrift_report::{HorizonMetrics, LayerRouting, RoutingDrift};
use qdrift_score::first_divergence;

use crate::assemble::aggregate::{Bootstrap, RoutingTrace, Trace, survival_summary};
use crate::error::EvalError;

/// Every prompt's routing trace, when every prompt has one (a model with experts).
fn routing_traces(traces: &[Trace]) -> Option<Vec<&RoutingTrace>> {
    traces.iter().map(|t| t.routing.as_ref()).collect::<Option<Vec<_>>>().filter(|r| !r.is_empty())
}

/// Sets the four routing metrics of each horizon of `metrics` (one entry per horizon, in order,
/// as `aggregate::horizon_metrics` returns them); nothing for a model without experts.
///
/// # Shapes
/// `traces: [prompts]`, each routing trace `[L, H]` with `H ≥` every horizon.
pub(crate) fn set_horizon_metrics(
    metrics: &mut [HorizonMetrics],
    traces: &[Trace],
    bootstrap: Bootstrap,
) -> Result<(), EvalError> {
    let Some(routing) = routing_traces(traces) else { return Ok(()) };
    for m in metrics {
        let h = m.tokens;
        let per_prompt = |f: &dyn Fn(&RoutingTrace) -> f64| routing.iter().map(|r| f(r)).collect::<Vec<f64>>();
        bootstrap.set_mean(m, "expert_overlap", per_prompt(&|r| r.overlap(h, true)))?;
        bootstrap.set_mean(m, "routing_flip_rate", per_prompt(&|r| r.flip_rate(h, true)))?;
        bootstrap.set_mean(m, "expert_overlap_on_generated_text", per_prompt(&|r| r.overlap(h, false)))?;
        bootstrap.set_mean(m, "routing_flip_rate_on_generated_text", per_prompt(&|r| r.flip_rate(h, false)))?;
    }
    Ok(())
}

/// The variant's routing drift over the first `longest` positions of the reference's text;
/// `None` for a model without experts.
pub(crate) fn routing_drift(
    traces: &[Trace],
    longest: usize,
    bootstrap: Bootstrap,
) -> Result<Option<RoutingDrift>, EvalError> {
    let Some(routing) = routing_traces(traces) else { return Ok(None) };
    let first = routing[0];
    // A prompt's first flip: the first position where some layer's top-1 expert differs.
    let always = vec![true; longest];
    let flips = routing
        .iter()
        .map(|r| first_divergence(&always, &r.all_layers_agree(), longest))
        .collect::<Result<Vec<_>, _>>()?;
    let first_flip = survival_summary(flips)?;
    let n = routing.len() as f64;
    let layers = first.layers.len();
    let flip_by_position = (0..longest)
        .map(|t| {
            let flipped = |r: &&RoutingTrace| (0..layers).filter(|&l| !r.layer_top1(l)[t]).count() as f64;
            routing.iter().map(flipped).sum::<f64>() / (n * layers as f64)
        })
        .collect();
    let layers = (0..layers).map(|l| layer_routing(&routing, l, longest, bootstrap)).collect::<Result<Vec<_>, _>>()?;
    Ok(Some(RoutingDrift {
        experts: first.experts as usize,
        top_k: first.top_k as usize,
        first_flip,
        flip_by_position,
        layers,
    }))
}

/// Layer `l`'s (an index into [`RoutingTrace::layers`]) rates over prompts and the median of
/// its first flip.
fn layer_routing(
    routing: &[&RoutingTrace],
    l: usize,
    longest: usize,
    bootstrap: Bootstrap,
) -> Result<LayerRouting, EvalError> {
    let rates: Vec<(f64, f64)> = routing.iter().map(|r| r.layer_rates(l, longest)).collect();
    let overlap: Vec<f64> = rates.iter().map(|r| r.0).collect();
    let flips: Vec<f64> = rates.iter().map(|r| r.1).collect();
    let always = vec![true; longest];
    let first_flips =
        routing.iter().map(|r| first_divergence(&always, r.layer_top1(l), longest)).collect::<Result<_, _>>()?;
    Ok(LayerRouting {
        layer: routing[0].layers[l] as usize,
        flip_rate: bootstrap.mean(&flips)?,
        expert_overlap: bootstrap.mean(&overlap)?,
        first_flip_median: survival_summary(first_flips)?.median,
    })
}
