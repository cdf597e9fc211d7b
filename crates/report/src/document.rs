//! What a rendered report says, independent of the markup: headings, paragraphs and tables.
//!
//! The Markdown and the HTML renderings are two printers of the one [`Block`] list built here, so
//! their tables cannot drift apart. Strings from the report (paths, names) are kept apart from
//! text written here ([`Inline::Name`], [`Inline::Code`]) so each printer escapes them for its
//! markup.
//!
//! The per-horizon tables and the glossary read their columns from the metric registry
//! ([`METRICS`]): the glossary lists every metric a report can hold, and so every metric a gate
//! can check; the tables show every metric the report has ([`shown_metrics`]).

use crate::format::{bytes, count, file_name, kld, rate, short_sha256};
use crate::metrics::{METRICS, Metric, Placement, metric};
use crate::{Estimate, FirstDivergence, HorizonMetrics, Report, RoutingDrift, Variant, VariantKind};

/// A run of text in a paragraph or a table cell.
#[derive(Clone, Debug)]
pub(crate) enum Inline {
    /// Text written by qdrift: needs no escaping beyond the markup's own.
    Text(String),
    /// Emphasised text written by qdrift.
    Strong(String),
    /// A string from the report (a variant or tensor name): escaped by each printer.
    Name(String),
    /// A string from the report shown as code (a path, an adapter).
    Code(String),
}

/// One cell: a sequence of runs.
pub(crate) type Cell = Vec<Inline>;

/// A table column.
#[derive(Clone, Debug)]
pub(crate) struct Column {
    pub title: &'static str,
    /// Right-aligned (numbers).
    pub numeric: bool,
}

/// A block of the document.
#[derive(Clone, Debug)]
pub(crate) enum Block {
    /// `level` 1–3; `id` is an anchor for the HTML.
    Heading {
        level: u8,
        id: String,
        text: String,
    },
    Paragraph(Vec<Inline>),
    Table {
        columns: Vec<Column>,
        rows: Vec<Vec<Cell>>,
    },
    /// Where the HTML puts its charts (the Markdown has none).
    Charts,
}

fn text(s: impl Into<String>) -> Inline {
    Inline::Text(s.into())
}

fn cell(s: impl Into<String>) -> Cell {
    vec![Inline::Text(s.into())]
}

fn name_cell(s: &str) -> Cell {
    vec![Inline::Name(s.to_string())]
}

fn col(title: &'static str, numeric: bool) -> Column {
    Column { title, numeric }
}

/// The kind as written in `report.json`.
pub(crate) fn kind_name(kind: VariantKind) -> &'static str {
    match kind {
        VariantKind::Scheme => "scheme",
        VariantKind::Checkpoint => "checkpoint",
        VariantKind::NoiseFloor => "noise_floor",
    }
}

/// The workload paragraph: everything a quality claim depends on, in one line. Files are named
/// by their name and short SHA-256, never by a path of the machine that wrote the report.
pub(crate) fn workload_line(report: &Report) -> Vec<Inline> {
    let w = &report.workload;
    let mut line = vec![Inline::Strong("Workload:".into()), text(" model ")];
    line.extend(model_description(report));
    line.push(text(" · backend "));
    line.push(Inline::Name(w.backend.clone()));
    line.push(text(" on "));
    line.push(Inline::Code(w.adapter.clone()));
    line.push(text(" · compute "));
    line.push(Inline::Name(w.compute_dtype.clone()));
    let horizons: Vec<String> = w.horizons.iter().map(usize::to_string).collect();
    line.push(text(format!(
        " · {} prompts · horizons {} · batch size {} · seed {} · {} bootstrap resamples · chat template {} · eval set ",
        w.prompts,
        horizons.join(", "),
        w.batch_size,
        w.seed,
        w.bootstrap_resamples,
        if w.chat_template { "on" } else { "off" },
    )));
    line.push(Inline::Code(file_name(&w.eval_set.path).to_string()));
    line.push(text(" (sha256 "));
    line.push(Inline::Name(short_sha256(&w.eval_set.sha256)));
    line.push(text(") · qdrift "));
    line.push(Inline::Name(w.qdrift_version.clone()));
    line
}

/// `` `stories260K.bin` (llama2.c · llama · 260.0K parameters · sha256 b0a507e7ad0f) ``: the
/// architecture only when it is not the format's name, the hash only when there is one
/// (synthetic models have none).
fn model_description(report: &Report) -> Vec<Inline> {
    let m = &report.model;
    let mut runs = vec![Inline::Code(file_name(&m.path).to_string()), text(" ("), Inline::Name(m.format.clone())];
    if m.architecture != m.format {
        runs.push(text(" · "));
        runs.push(Inline::Name(m.architecture.clone()));
    }
    runs.push(text(format!(" · {} parameters", count(m.parameters))));
    if !m.sha256.is_empty() {
        runs.push(text(" · sha256 "));
        runs.push(Inline::Name(short_sha256(&m.sha256)));
    }
    if m.synthetic {
        runs.push(text(" · "));
        runs.push(Inline::Strong("synthetic weights".into()));
    }
    runs.push(text(")"));
    runs
}

/// The whole document, section by section.
pub(crate) fn document(report: &Report) -> Vec<Block> {
    let mut doc = vec![
        Block::Heading { level: 1, id: "qdrift-report".into(), text: "qdrift report".into() },
        Block::Paragraph(workload_line(report)),
        Block::Paragraph(reference_line(report)),
    ];
    doc.extend(variants_section(report));
    doc.push(Block::Charts);
    for &h in &report.workload.horizons {
        doc.extend(horizon_section(report, h));
    }
    doc.extend(first_divergence_section(report));
    doc.extend(routing_section(report));
    doc.extend(entropy_strata_section(report));
    doc.extend(per_tensor_section(report));
    doc.extend(metrics_section());
    doc
}

fn heading(id: &str, text: impl Into<String>) -> Block {
    Block::Heading { level: 2, id: id.into(), text: text.into() }
}

/// What the reference is and its perplexity of its own continuations.
fn reference_line(report: &Report) -> Vec<Inline> {
    let r = &report.reference;
    let mut line = vec![
        Inline::Strong("Reference:".into()),
        text(" "),
        Inline::Name(r.name.clone()),
        text(format!(" weights ({}), computing in ", bytes(r.weight_bytes))),
        Inline::Name(r.compute_dtype.clone()),
    ];
    if !r.self_perplexity.is_empty() {
        let ppl: Vec<String> = r.self_perplexity.iter().map(|(h, p)| format!("{} @{h}", rate(*p))).collect();
        line.push(text(format!("; perplexity of its own continuations {}", ppl.join(", "))));
    }
    match &r.kl {
        Some(crate::KlMethod::TopKTail { top_k, tail_mass_max, tail_mass_mean }) => line.push(text(format!(
            ". KL divergence against its top-{top_k} log-probabilities plus one tail bucket per position \
             (a lower bound of the exact KL; tail mass mean {tail_mass_mean:.2e}, max {tail_mass_max:.2e})"
        ))),
        Some(crate::KlMethod::Exact) => line.push(text(". KL divergence over the full vocabulary")),
        None => {}
    }
    line.push(text("."));
    line
}

/// One row per variant: what it is and what its weights cost.
fn variants_section(report: &Report) -> Vec<Block> {
    let part = |p: Option<&String>| p.map_or_else(|| cell("—"), |s| name_cell(s));
    let rows = report
        .variants_grouped()
        .into_iter()
        .map(|v| {
            let r = v.recipe.as_ref();
            vec![
                name_cell(&v.name),
                cell(v.group()),
                cell(kind_name(v.kind)),
                name_cell(
                    r.map(|r| r.weights.as_str())
                        .or(v.scheme.as_deref())
                        .or(v.path.as_deref().map(file_name))
                        .unwrap_or("—"),
                ),
                part(r.and_then(|r| r.activations.as_ref())),
                part(r.and_then(|r| r.kv_cache.as_ref())),
                name_cell(&v.compute_dtype),
                cell(format!("{:.3}", v.bits_per_weight)),
                cell(bytes(v.weight_bytes)),
            ]
        })
        .collect();
    let columns = vec![
        col("Variant", false),
        col("Quantizes", false),
        col("Kind", false),
        col("Weights / checkpoint", false),
        col("Activations", false),
        col("KV cache", false),
        col("Compute", false),
        col("Bits/weight", true),
        col("Weights", true),
    ];
    vec![heading("variants", "Variants"), Block::Table { columns, rows }]
}

/// The metrics of [`METRICS`] the per-horizon tables and the terminal summary show, in table
/// order: every required metric and excess over the noise floor, and an
/// [`Placement::Optional`] metric only when some variant has it at some horizon. A metric no
/// variant has (the routing metrics of a dense model, a metric added after the report was
/// written) shows no column of `—`; one that some variants have shows `—` for the others.
pub(crate) fn shown_metrics(report: &Report) -> Vec<&'static Metric> {
    let present = |m: &Metric| report.variants.iter().any(|v| v.horizons.iter().any(|h| h.get(m).is_some()));
    METRICS.iter().filter(|m| m.placement != Placement::Optional || present(m)).collect()
}

/// Every metric the report has ([`shown_metrics`]) of every variant at horizon `h`, each with
/// its interval.
fn horizon_section(report: &Report, h: usize) -> Vec<Block> {
    let intro = "Means over prompts with their 95% intervals [lo, hi]; each column is described under \
                 Metrics at the end. Excess = variant − noise floor, paired by prompt; the noise floor has none.";
    let shown = shown_metrics(report);
    let rows =
        report.variants_grouped().into_iter().filter_map(|v| v.horizon(h).map(|m| metric_row(&shown, v, m))).collect();
    vec![
        heading(&format!("horizon-{h}"), format!("First {h} generated tokens")),
        Block::Paragraph(vec![text(intro)]),
        Block::Table { columns: metric_columns(&shown), rows },
    ]
}

/// `Variant`, `Quantizes`, then per metric of `shown` its title (and its p99 column, if it has
/// one).
fn metric_columns(shown: &[&Metric]) -> Vec<Column> {
    let mut columns = vec![col("Variant", false), col("Quantizes", false)];
    for m in shown {
        columns.push(col(m.title, true));
        columns.extend(m.tail.map(|title| col(title, true)));
    }
    columns
}

/// A row of [`metric_columns`] of `shown`: `—` for a metric the variant does not have.
fn metric_row(shown: &[&Metric], v: &Variant, h: &HorizonMetrics) -> Vec<Cell> {
    let mut row = vec![name_cell(&v.name), cell(v.group())];
    for &m in shown {
        let value = h.get(m);
        row.push(cell(value.map_or_else(|| "—".to_string(), |e| m.with_ci(e))));
        if m.tail.is_some() {
            let p99 = value.and_then(|e| e.distribution).map(|d| (m.format)(d.p99));
            row.push(cell(p99.unwrap_or_else(|| "—".to_string())));
        }
    }
    row
}

/// A Kaplan–Meier median position: the position, or `> H (not reached)` when more than half the
/// prompts have no event within the longest horizon `H`.
fn median_cell(median: Option<usize>, longest: usize) -> Cell {
    cell(median.map_or_else(|| format!("> {longest} (not reached)"), |t| t.to_string()))
}

/// `c of n`: the censored prompts of a first-event curve, of all prompts.
fn censored_cell(report: &Report, fd: &FirstDivergence) -> Cell {
    let of = if fd.positions.is_empty() { report.workload.prompts } else { fd.positions.len() };
    cell(format!("{} of {of}", fd.censored))
}

/// The Kaplan–Meier median first-divergence position of each variant.
fn first_divergence_section(report: &Report) -> Vec<Block> {
    let longest = report.workload.horizons.last().copied().unwrap_or(0);
    let intro = format!(
        "The position where a prompt's free-running continuation first differs from the reference's \
         (Kaplan–Meier median); censored prompts never diverged within {longest} tokens."
    );
    let rows = report
        .variants_grouped()
        .into_iter()
        .map(|v| {
            let fd = &v.first_divergence;
            vec![name_cell(&v.name), cell(v.group()), median_cell(fd.median, longest), censored_cell(report, fd)]
        })
        .collect();
    let columns =
        vec![col("Variant", false), col("Quantizes", false), col("Median position", true), col("Censored", true)];
    vec![
        heading("first-divergence", "First divergence"),
        Block::Paragraph(vec![text(intro)]),
        Block::Table { columns, rows },
    ]
}

/// For a model with experts, where each variant routes tokens to other experts than the
/// reference: a table of the first routing flip per variant (Variant, Quantizes, Experts as
/// `k of n`, First flip as the Kaplan–Meier median position, Censored as `c of n` prompts) and a
/// table per (variant, mixture-of-experts layer) (Routing flips and Expert overlap over the
/// longest horizon with their intervals, First flip as that layer's median position). Nothing
/// when no variant has routing (a dense model).
fn routing_section(report: &Report) -> Vec<Block> {
    let routed: Vec<(&Variant, &RoutingDrift)> =
        report.variants_grouped().into_iter().filter_map(|v| v.routing.as_ref().map(|r| (v, r))).collect();
    if routed.is_empty() {
        return Vec::new();
    }
    let longest = report.workload.horizons.last().copied().unwrap_or(0);
    let intro = format!(
        "Both models teacher-forced on the reference's continuation, over its first {longest} tokens: per \
         mixture-of-experts layer, the top-k experts each model routes each position to. A flip is a \
         different top-1 expert; overlap is |S ∩ S_ref| / k, the share of the reference's k experts the \
         variant also chose. First flip: the Kaplan–Meier median position of a prompt's first flip, in any \
         layer (first table) or in that layer (second table); censored prompts had no flip in any layer \
         within {longest} tokens. Routing flips and expert overlap are means over prompts with their 95% \
         bootstrap intervals over prompts. The noise floor's rows are what routing differs by without \
         quantization."
    );
    let rows = routed
        .iter()
        .map(|&(v, r)| {
            vec![
                name_cell(&v.name),
                cell(v.group()),
                cell(format!("{} of {}", r.top_k, r.experts)),
                median_cell(r.first_flip.median, longest),
                censored_cell(report, &r.first_flip),
            ]
        })
        .collect();
    let columns = vec![
        col("Variant", false),
        col("Quantizes", false),
        col("Experts", true),
        col("First flip", true),
        col("Censored", true),
    ];
    vec![
        heading("expert-routing", "Expert routing"),
        Block::Paragraph(vec![text(intro)]),
        Block::Table { columns, rows },
        routing_layers_table(&routed, longest),
    ]
}

/// One row per (variant, mixture-of-experts layer): Variant, Layer (the block, 0-based), Routing
/// flips and Expert overlap (mean [lo, hi] over the longest horizon), First flip (that layer's
/// Kaplan–Meier median position).
fn routing_layers_table(routed: &[(&Variant, &RoutingDrift)], longest: usize) -> Block {
    let with_ci = |name: &str, e: &Estimate| cell(metric(name).map_or_else(|| "—".to_string(), |m| m.with_ci(e)));
    let rows = routed
        .iter()
        .flat_map(|&(v, r)| {
            r.layers.iter().map(move |l| {
                vec![
                    name_cell(&v.name),
                    cell(l.layer.to_string()),
                    with_ci("routing_flip_rate", &l.flip_rate),
                    with_ci("expert_overlap", &l.expert_overlap),
                    median_cell(l.first_flip_median, longest),
                ]
            })
        })
        .collect();
    let columns = vec![
        col("Variant", false),
        col("Layer", true),
        col("Routing flips", true),
        col("Expert overlap", true),
        col("First flip", true),
    ];
    Block::Table { columns, rows }
}

/// KLD and top-1 agreement by quartile of the reference's entropy.
fn entropy_strata_section(report: &Report) -> Vec<Block> {
    let longest = report.workload.horizons.last().copied().unwrap_or(0);
    let intro = format!(
        "Teacher-forced KLD and top-1 agreement by quartile of the reference's entropy, over all \
         positions of the first {longest} tokens."
    );
    let rows = report
        .variants
        .iter()
        .flat_map(|v| {
            v.entropy_strata.iter().map(move |s| {
                vec![
                    name_cell(&v.name),
                    cell(format!("[{:.2}, {:.2})", s.entropy_lo, s.entropy_hi)),
                    cell(s.positions.to_string()),
                    cell(s.kld_mean.map_or("—".into(), kld)),
                    cell(s.top1_agreement.map_or("—".into(), rate)),
                ]
            })
        })
        .collect();
    let columns = vec![
        col("Variant", false),
        col("Entropy (nats)", true),
        col("Positions", true),
        col("KLD mean", true),
        col("Top-1 agreement", true),
    ];
    vec![
        heading("entropy-strata", "Entropy strata"),
        Block::Paragraph(vec![text(intro)]),
        Block::Table { columns, rows },
    ]
}

/// The error of each quantized weight tensor, and which variants have none.
fn per_tensor_section(report: &Report) -> Vec<Block> {
    let rows = report
        .variants
        .iter()
        .flat_map(|v| {
            v.per_tensor_error.iter().map(move |t| {
                vec![
                    name_cell(&v.name),
                    vec![Inline::Code(t.tensor.clone())],
                    cell(t.sqnr_db.map_or("exact".into(), |db| format!("{db:.2}"))),
                    cell(format!("{:.3e}", t.rel_frobenius)),
                    cell(format!("{:.6}", t.cosine)),
                ]
            })
        })
        .collect();
    let columns = vec![
        col("Variant", false),
        col("Tensor", false),
        col("SQNR (dB)", true),
        col("Rel. Frobenius", true),
        col("Cosine", true),
    ];
    vec![
        heading("per-tensor-error", "Per-tensor error"),
        Block::Paragraph(per_tensor_note(report)),
        Block::Table { columns, rows },
    ]
}

fn per_tensor_note(report: &Report) -> Vec<Inline> {
    let without: Vec<&str> =
        report.variants.iter().filter(|v| v.per_tensor_error.is_empty()).map(|v| v.name.as_str()).collect();
    let mut note = vec![text(
        "Signal-to-quantization-noise ratio of each quantized weight tensor (\"exact\": reconstructed \
         exactly), relative Frobenius error and cosine similarity against the reference.",
    )];
    if !without.is_empty() {
        note.push(text(" No quantized tensors: "));
        for (i, n) in without.iter().enumerate() {
            if i > 0 {
                note.push(text(", "));
            }
            note.push(Inline::Name((*n).to_string()));
        }
        note.push(text("."));
    }
    note
}

/// The glossary: each metric's column, its name in `report.json` and thresholds files, what it
/// measures and which way is better.
fn metrics_section() -> Vec<Block> {
    let rows = METRICS
        .iter()
        .map(|m| {
            vec![cell(m.title), vec![Inline::Code(m.name.to_string())], cell(m.description), cell(m.better.describe())]
        })
        .collect();
    let columns = vec![col("Column", false), col("Name", false), col("What it measures", false), col("Better", false)];
    vec![
        heading("metrics", "Metrics"),
        Block::Paragraph(vec![text(
            "Name: what report.json and a thresholds file of qdrift gate (NAME@h) call the metric.",
        )]),
        Block::Table { columns, rows },
    ]
}
