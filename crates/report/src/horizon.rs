//! [`HorizonMetrics`]: a variant's metrics over the first `h` generated tokens, held by name.
//!
//! The metrics are not one field each: they are [`Estimate`]s keyed by their name in
//! [`METRICS`], so a new metric is a new table entry, not a new field here. The JSON layout is
//! written by hand to stay what it has been since schema 1: `tokens`, then the top-level metrics in
//! table order, then the differences against the noise floor nested under
//! `excess_over_noise_floor` (absent when there are none), then `per_prompt`: for each metric
//! whose estimate follows from one value per prompt ([`PerPrompt`](crate::PerPrompt)), those
//! values in prompt order (added in schema 2 as an optional key; what `qdrift compare` pairs
//! prompt by prompt).

use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ReportError;
use crate::metrics::{EXCESS_KEY, Estimate, METRICS, Metric, PER_PROMPT_KEY, Placement, metric, rank};

/// Metrics over the first `tokens` generated positions: the horizon `h` and one [`Estimate`]
/// per metric of [`METRICS`] the variant has.
#[derive(Clone, Debug, PartialEq)]
pub struct HorizonMetrics {
    /// The horizon `h`.
    pub tokens: usize,
    /// `(name, estimate)` in [`METRICS`] order, each name at most once.
    values: Vec<(&'static str, Estimate)>,
    /// `(name, one value per prompt)` in [`METRICS`] order, for metrics with a
    /// [`PerPrompt`](crate::PerPrompt) statistic.
    per_prompt: Vec<(&'static str, Vec<f64>)>,
}

impl HorizonMetrics {
    /// No metrics yet, at horizon `tokens`.
    pub fn new(tokens: usize) -> HorizonMetrics {
        HorizonMetrics { tokens, values: Vec::new(), per_prompt: Vec::new() }
    }

    /// Sets metric `name` (replacing any value it had). [`ReportError::Invalid`] for a name that
    /// is not in [`METRICS`].
    pub fn set(&mut self, name: &str, value: Estimate) -> Result<(), ReportError> {
        let m = metric(name).ok_or_else(|| ReportError::Invalid(format!("no metric is named {name}")))?;
        self.insert(m, value);
        Ok(())
    }

    fn insert(&mut self, m: &'static Metric, value: Estimate) {
        insert_ranked(&mut self.values, m, value);
    }

    /// Sets the per-prompt values of metric `name`, whose estimate is its
    /// [`PerPrompt`](crate::PerPrompt) statistic of them. [`ReportError::Invalid`] for a name
    /// that is not in [`METRICS`] or has no such statistic.
    pub fn set_per_prompt(&mut self, name: &str, values: Vec<f64>) -> Result<(), ReportError> {
        let m = metric(name)
            .filter(|m| m.per_prompt.is_some())
            .ok_or_else(|| ReportError::Invalid(format!("no metric with per-prompt values is named {name}")))?;
        insert_ranked(&mut self.per_prompt, m, values);
        Ok(())
    }

    /// The per-prompt values of metric `name`, if the report has them.
    pub fn per_prompt(&self, name: &str) -> Option<&[f64]> {
        self.per_prompt.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_slice())
    }

    /// Every metric's per-prompt values, in [`METRICS`] order.
    pub fn per_prompt_values(&self) -> impl Iterator<Item = (&'static str, &[f64])> {
        self.per_prompt.iter().map(|(n, v)| (*n, v.as_slice()))
    }

    /// A metric by name: `None` for an unknown name or a metric the variant does not have (an
    /// excess over the noise floor on the noise floor itself).
    pub fn metric(&self, name: &str) -> Option<&Estimate> {
        self.values.iter().find(|(n, _)| *n == name).map(|(_, e)| e)
    }

    /// The value of metric `m`, if the variant has it.
    pub fn get(&self, m: &Metric) -> Option<&Estimate> {
        self.metric(m.name)
    }

    /// Every metric the variant has, in [`METRICS`] order.
    pub fn iter(&self) -> impl Iterator<Item = (&'static Metric, &Estimate)> {
        METRICS.iter().filter_map(|m| self.get(m).map(|e| (m, e)))
    }
}

impl Serialize for HorizonMetrics {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("tokens", &self.tokens)?;
        let mut excess = Vec::new();
        for (m, e) in self.iter() {
            match m.placement {
                Placement::Required | Placement::Optional => map.serialize_entry(m.name, e)?,
                Placement::Excess { key } => excess.push((key, e)),
            }
        }
        if !excess.is_empty() {
            map.serialize_entry(EXCESS_KEY, &Entries(&excess))?;
        }
        if !self.per_prompt.is_empty() {
            map.serialize_entry(PER_PROMPT_KEY, &PromptValues(&self.per_prompt))?;
        }
        map.end()
    }
}

/// Sets `m`'s entry of `entries` (kept in [`METRICS`] order, each name once) to `value`.
fn insert_ranked<T>(entries: &mut Vec<(&'static str, T)>, m: &'static Metric, value: T) {
    let at = entries.partition_point(|(n, _)| rank(n) < rank(m.name));
    match entries.get_mut(at) {
        Some(slot) if slot.0 == m.name => slot.1 = value,
        _ => entries.insert(at, (m.name, value)),
    }
}

/// `(name, values)` pairs serialized as one JSON object, in order.
struct PromptValues<'a>(&'a [(&'static str, Vec<f64>)]);

impl Serialize for PromptValues<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, values) in self.0 {
            map.serialize_entry(key, values)?;
        }
        map.end()
    }
}

/// `(key, estimate)` pairs serialized as one JSON object, in order.
struct Entries<'a>(&'a [(&'static str, &'a Estimate)]);

impl Serialize for Entries<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, e) in self.0 {
            map.serialize_entry(key, e)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for HorizonMetrics {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<HorizonMetrics, D::Error> {
        deserializer.deserialize_map(HorizonVisitor)
    }
}

/// Reads a horizon's object: keys this build does not know are skipped (the schema version
/// rule), a required metric that is missing is an error.
struct HorizonVisitor;

impl<'de> Visitor<'de> for HorizonVisitor {
    type Value = HorizonMetrics;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a horizon's metrics")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<HorizonMetrics, A::Error> {
        let mut tokens = None;
        let mut h = HorizonMetrics::new(0);
        while let Some(key) = map.next_key::<String>()? {
            if key == "tokens" {
                tokens = Some(map.next_value()?);
            } else if key == PER_PROMPT_KEY {
                let values: std::collections::BTreeMap<String, Vec<f64>> = map.next_value()?;
                // Names this build does not know, or knows without per-prompt values, are skipped.
                for (name, v) in values {
                    if metric(&name).is_some_and(|m| m.per_prompt.is_some()) {
                        h.set_per_prompt(&name, v).map_err(de::Error::custom)?;
                    }
                }
            } else if key == EXCESS_KEY {
                for (m, e) in map.next_value::<ExcessMetrics>()?.0 {
                    insert_once(&mut h, m, e)?;
                }
            } else if let Some(m) = metric(&key).filter(|m| !m.is_excess()) {
                insert_once(&mut h, m, map.next_value()?)?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        h.tokens = tokens.ok_or_else(|| de::Error::missing_field("tokens"))?;
        if let Some(m) = METRICS.iter().find(|m| m.placement == Placement::Required && h.get(m).is_none()) {
            return Err(de::Error::missing_field(m.name));
        }
        Ok(h)
    }
}

fn insert_once<E: de::Error>(h: &mut HorizonMetrics, m: &'static Metric, e: Estimate) -> Result<(), E> {
    if h.get(m).is_some() {
        return Err(E::duplicate_field(m.name));
    }
    h.insert(m, e);
    Ok(())
}

/// The metrics of an `excess_over_noise_floor` object.
struct ExcessMetrics(Vec<(&'static Metric, Estimate)>);

impl<'de> Deserialize<'de> for ExcessMetrics {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ExcessMetrics, D::Error> {
        deserializer.deserialize_map(ExcessVisitor)
    }
}

struct ExcessVisitor;

impl<'de> Visitor<'de> for ExcessVisitor {
    type Value = ExcessMetrics;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("the differences against the noise floor")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ExcessMetrics, A::Error> {
        let mut out = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let known = METRICS.iter().find(|m| matches!(m.placement, Placement::Excess { key: k } if k == key));
            match known {
                Some(m) => out.push((m, map.next_value()?)),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(ExcessMetrics(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Distribution;

    /// The value every number of metric `name` has in [`full`].
    fn value(name: &str) -> f64 {
        0.01 * (rank(name).unwrap() + 1) as f64
    }

    fn full(tokens: usize) -> HorizonMetrics {
        let mut h = HorizonMetrics::new(tokens);
        // Set in reverse: the order of the JSON keys is the table's, not the caller's.
        for m in METRICS.iter().rev() {
            let x = value(m.name);
            let distribution = m.tail.map(|_| Distribution { median: x, p90: x, p99: x, max: x });
            h.set(m.name, Estimate { mean: x, distribution, ci95: [x, x] }).unwrap();
        }
        h
    }

    #[test]
    fn json_keys_follow_the_table_with_excess_nested() {
        let json = serde_json::to_string(&full(10)).unwrap();
        let (tm, kld) = (value("token_match_rate"), value("kld"));
        assert!(
            json.starts_with(&format!("{{\"tokens\":10,\"token_match_rate\":{{\"mean\":{tm},\"ci95\":[{tm},{tm}]}}"))
        );
        let kld = format!("\"kld\":{{\"mean\":{kld},\"median\":{kld},\"p90\":{kld},\"p99\":{kld},\"max\":{kld},");
        assert!(json.contains(&kld), "{json}");
        let (etm, ekld) = (value("excess_token_match_rate"), value("excess_kld"));
        let excess = format!(
            "\"excess_over_noise_floor\":{{\"token_match_rate\":{{\"mean\":{etm},\"ci95\":[{etm},{etm}]}},\
             \"kld\":{{\"mean\":{ekld},\"ci95\":[{ekld},{ekld}]}}}}}}"
        );
        assert!(json.ends_with(&excess), "{json}");
        let back: HorizonMetrics = serde_json::from_str(&json).unwrap();
        assert_eq!(back, full(10));
    }

    #[test]
    fn unknown_keys_are_ignored_and_a_required_metric_is_not() {
        let mut json: serde_json::Value = serde_json::to_value(full(10)).unwrap();
        json["a_metric_of_a_later_qdrift"] = serde_json::json!({"mean": 1.0, "ci95": [1.0, 1.0]});
        json[EXCESS_KEY]["later"] = serde_json::json!(3);
        let back: HorizonMetrics = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, full(10));
        json.as_object_mut().unwrap().remove("kld");
        let e = serde_json::from_value::<HorizonMetrics>(json).unwrap_err();
        assert!(e.to_string().contains("missing field `kld`"), "{e}");
    }

    #[test]
    fn set_refuses_an_unknown_name() {
        let mut h = HorizonMetrics::new(1);
        assert!(h.set("kl_divergence", Estimate::new(0.0, [0.0, 0.0])).is_err());
        h.set("kld", Estimate::new(0.5, [0.0, 1.0])).unwrap();
        h.set("kld", Estimate::new(0.25, [0.0, 1.0])).unwrap();
        assert_eq!(h.metric("kld").map(|e| e.mean), Some(0.25));
        assert_eq!(h.iter().count(), 1);
    }
}
