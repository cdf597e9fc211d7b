//! `--gate` thresholds checked against the run before it starts: every variant a check names
//! must be one the run produces, every horizon one it measures, and some check must apply. The
//! same rules as [`qdrift_report::gate`] resolves against a finished report, so a thresholds file
//! that passes here cannot fail there for want of a variant or horizon.

use qdrift_report::{GateError, Thresholds, WILDCARD};

use crate::check::config::EvalConfig;
use crate::check::config::VariantSpec;

/// Checks `thresholds` against the variants of `cfg` (the noise floor first) and `horizons`.
pub(crate) fn check_thresholds(cfg: &EvalConfig, horizons: &[usize], thresholds: &Thresholds) -> Result<(), GateError> {
    let noise_floor = VariantSpec::NoiseFloor.name(cfg.dtype);
    let names: Vec<String> =
        std::iter::once(noise_floor.clone()).chain(cfg.variants.iter().map(|v| v.name(cfg.dtype))).collect();
    let mut applies = false;
    for c in &thresholds.checks {
        let key = || format!("variant.\"{}\" \"{}@{}\"", c.variant, c.metric, c.horizon);
        if c.variant != WILDCARD && !names.contains(&c.variant) {
            return Err(GateError::UnknownVariant { name: c.variant.clone(), known: names });
        }
        if !horizons.contains(&c.horizon) {
            return Err(GateError::UnknownHorizon { at: key(), horizon: c.horizon, known: horizons.to_vec() });
        }
        if c.variant == noise_floor && c.metric.starts_with("excess_") {
            return Err(GateError::ExcessOnNoiseFloor { at: key(), variant: noise_floor });
        }
        // `*` skips the noise floor: it applies only when the run has another variant.
        applies |= c.variant != WILDCARD || names.len() > 1;
    }
    if !applies {
        return Err(GateError::NoChecks);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use qdrift_quantize::Recipe;

    fn config(schemes: &[&str]) -> EvalConfig {
        let mut cfg = EvalConfig::new("model.bin".into());
        cfg.variants = schemes.iter().map(|s| VariantSpec::Scheme(s.parse::<Recipe>().expect("scheme"))).collect();
        cfg
    }

    fn check(cfg: &EvalConfig, text: &str) -> Result<(), GateError> {
        check_thresholds(cfg, &[10, 100], &Thresholds::parse(text).expect("parses"))
    }

    #[test]
    fn thresholds_must_name_variants_and_horizons_of_the_run() {
        let cfg = config(&["int8"]);
        assert!(check(&cfg, "[variant.\"int8\"]\n\"kld@10\" = { max = 1.0 }").is_ok());
        assert!(check(&cfg, "[variant.\"*\"]\n\"kld@100\" = { max = 1.0 }").is_ok());
        let e = check(&cfg, "[variant.\"int9\"]\n\"kld@10\" = { max = 1.0 }").unwrap_err().to_string();
        assert!(e.contains("\"int9\"") && e.contains("int8"), "{e}");
        let e = check(&cfg, "[variant.\"int8\"]\n\"kld@1000\" = { max = 1.0 }").unwrap_err().to_string();
        assert!(e.contains("no horizon 1000"), "{e}");
        let e = check(&config(&[]), "[variant.\"*\"]\n\"kld@10\" = { max = 1.0 }").unwrap_err();
        assert!(matches!(e, GateError::NoChecks), "{e}");
    }
}
