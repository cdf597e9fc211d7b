//! `schema/report.schema.json` is what [`report_json_schema`] builds from the report's types and
//! the metric registry, byte for byte. `QDRIFT_BLESS=1` rewrites the file instead (after adding a
//! metric or a field). CI validates both example reports and a freshly written one against the
//! file with an independent validator (`cargo xtask ci`, `check-jsonschema`).

use std::path::Path;

use qdrift_report::metrics::{METRICS, Placement};
use qdrift_report::report_json_schema;

#[test]
fn the_committed_schema_is_the_generated_one() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schema/report.schema.json");
    let generated = serde_json::to_string_pretty(&report_json_schema()).expect("JSON") + "\n";
    if std::env::var("QDRIFT_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(&path, &generated).expect("write the schema");
    }
    let committed = std::fs::read_to_string(&path).expect("schema/report.schema.json");
    assert!(committed == generated, "schema/report.schema.json is stale: rerun this test with QDRIFT_BLESS=1");
}

/// Every metric of the registry is in the schema where the JSON puts it, required when the
/// registry requires it, with a distribution when it has one.
#[test]
fn every_registry_metric_is_in_the_schema() {
    let schema = report_json_schema();
    let horizon = &schema["$defs"]["horizon"];
    let required: Vec<&str> = horizon["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for m in METRICS {
        let (entry, must) = match m.placement {
            Placement::Required => (&horizon["properties"][m.name], true),
            Placement::Optional => (&horizon["properties"][m.name], false),
            Placement::Excess { key } => (&horizon["properties"]["excess_over_noise_floor"]["properties"][key], false),
        };
        assert_eq!(entry["type"], "object", "{}", m.name);
        assert_eq!(required.contains(&m.name), must, "{}", m.name);
        assert_eq!(entry["properties"].get("p99").is_some(), m.tail.is_some(), "{}", m.name);
    }
    assert_eq!(schema["properties"]["schema_version"]["const"], qdrift_report::SCHEMA_VERSION);
}
