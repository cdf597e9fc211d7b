//! What a rendered report says, independent of the markup: headings, paragraphs and tables.
//!
//! The Markdown and the HTML renderings are two printers of the one [`Block`] list built here, so
//! their tables cannot drift apart. Strings from the report (paths, names) are kept apart from
//! text written here ([`Inline::Name`], [`Inline::Code`]) so each printer escapes them for its
//! markup.

use crate::format::{bytes, count, kld, rate, signed_kld, signed_rate, with_ci};
use crate::{Report, VariantKind};

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

/// The workload paragraph: everything a quality claim depends on, in one line.
pub(crate) fn workload_line(report: &Report) -> Vec<Inline> {
    let m = &report.model;
    let w = &report.workload;
    let mut line = vec![
        Inline::Strong("Workload:".into()),
        text(" model "),
        Inline::Code(m.path.clone()),
        text(format!(" ({} parameters, ", count(m.parameters))),
        Inline::Name(m.architecture.clone()),
        text(", "),
        Inline::Name(m.format.clone()),
    ];
    if m.synthetic {
        line.push(text(", "));
        line.push(Inline::Strong("synthetic weights".into()));
    }
    line.push(text(") · backend "));
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
    line.push(Inline::Code(w.eval_set.path.clone()));
    let sha: String = w.eval_set.sha256.chars().take(12).collect();
    line.push(text(" (sha256 "));
    line.push(Inline::Name(sha));
    line.push(text(") · qdrift "));
    line.push(Inline::Name(w.qdrift_version.clone()));
    line
}

/// The whole document.
pub(crate) fn document(report: &Report) -> Vec<Block> {
    let mut doc = vec![
        Block::Heading { level: 1, id: "qdrift-report".into(), text: "qdrift report".into() },
        Block::Paragraph(workload_line(report)),
    ];
    let r = &report.reference;
    let mut reference = vec![
        Inline::Strong("Reference:".into()),
        text(" "),
        Inline::Name(r.name.clone()),
        text(format!(" weights ({}), computing in ", bytes(r.weight_bytes))),
        Inline::Name(r.compute_dtype.clone()),
    ];
    if !r.self_perplexity.is_empty() {
        let ppl: Vec<String> = r.self_perplexity.iter().map(|(h, p)| format!("{} @{h}", rate(*p))).collect();
        reference.push(text(format!("; perplexity of its own continuations {}", ppl.join(", "))));
    }
    reference.push(text("."));
    doc.push(Block::Paragraph(reference));

    doc.push(Block::Heading { level: 2, id: "variants".into(), text: "Variants".into() });
    doc.push(Block::Table {
        columns: vec![
            col("Variant", false),
            col("Kind", false),
            col("Scheme / checkpoint", false),
            col("Compute", false),
            col("Bits/weight", true),
            col("Weights", true),
        ],
        rows: report
            .variants
            .iter()
            .map(|v| {
                vec![
                    name_cell(&v.name),
                    cell(kind_name(v.kind)),
                    name_cell(v.scheme.as_deref().or(v.path.as_deref()).unwrap_or("—")),
                    name_cell(&v.compute_dtype),
                    cell(format!("{:.3}", v.bits_per_weight)),
                    cell(bytes(v.weight_bytes)),
                ]
            })
            .collect(),
    });
    doc.push(Block::Charts);

    for &h in &report.workload.horizons {
        doc.push(Block::Heading { level: 2, id: format!("horizon-{h}"), text: format!("First {h} generated tokens") });
        doc.push(Block::Paragraph(vec![text(
            "Means over prompts with their 95% intervals [lo, hi]. Token match and exact match are \
             free-running; KLD (nats), top-1 and PPL ratio are teacher-forced on the reference's \
             continuation. Excess = variant − noise floor, paired by prompt.",
        )]));
        let rows = report
            .variants
            .iter()
            .filter_map(|v| v.horizon(h).map(|m| (v, m)))
            .map(|(v, m)| {
                let kld_ci = crate::MeanCi { mean: m.kld.mean, ci95: m.kld.ci95 };
                let (excess_tm, excess_kld) = match &m.excess_over_noise_floor {
                    Some(e) => (with_ci(&e.token_match_rate, signed_rate), with_ci(&e.kld, signed_kld)),
                    None => ("—".to_string(), "—".to_string()),
                };
                vec![
                    name_cell(&v.name),
                    cell(with_ci(&m.token_match_rate, rate)),
                    cell(with_ci(&m.exact_match_fraction, rate)),
                    cell(with_ci(&kld_ci, kld)),
                    cell(kld(m.kld.p99)),
                    cell(with_ci(&m.top1_agreement, rate)),
                    cell(with_ci(&m.ppl_ratio_on_reference_text, rate)),
                    cell(with_ci(&m.ppl_drift_of_generated_text, rate)),
                    cell(excess_tm),
                    cell(excess_kld),
                ]
            })
            .collect();
        doc.push(Block::Table {
            columns: vec![
                col("Variant", false),
                col("Token match", true),
                col("Exact match", true),
                col("KLD mean", true),
                col("KLD p99", true),
                col("Top-1 agreement", true),
                col("PPL ratio (ref. text)", true),
                col("PPL drift (gen. text)", true),
                col("Excess token match", true),
                col("Excess KLD", true),
            ],
            rows,
        });
    }

    let longest = report.workload.horizons.last().copied().unwrap_or(0);
    doc.push(Block::Heading { level: 2, id: "first-divergence".into(), text: "First divergence".into() });
    doc.push(Block::Paragraph(vec![text(format!(
        "The position where a prompt's free-running continuation first differs from the reference's \
         (Kaplan–Meier median); censored prompts never diverged within {longest} tokens."
    ))]));
    doc.push(Block::Table {
        columns: vec![col("Variant", false), col("Median position", true), col("Censored", true)],
        rows: report
            .variants
            .iter()
            .map(|v| {
                let fd = &v.first_divergence;
                let median = match fd.median {
                    Some(t) => t.to_string(),
                    None => format!("> {longest} (not reached)"),
                };
                let of = if fd.positions.is_empty() { report.workload.prompts } else { fd.positions.len() };
                vec![name_cell(&v.name), cell(median), cell(format!("{} of {of}", fd.censored))]
            })
            .collect(),
    });

    doc.push(Block::Heading { level: 2, id: "entropy-strata".into(), text: "Entropy strata".into() });
    doc.push(Block::Paragraph(vec![text(format!(
        "Teacher-forced KLD and top-1 agreement by quartile of the reference's entropy, over all \
         positions of the first {longest} tokens."
    ))]));
    doc.push(Block::Table {
        columns: vec![
            col("Variant", false),
            col("Entropy (nats)", true),
            col("Positions", true),
            col("KLD mean", true),
            col("Top-1 agreement", true),
        ],
        rows: report
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
            .collect(),
    });

    doc.push(Block::Heading { level: 2, id: "per-tensor-error".into(), text: "Per-tensor error".into() });
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
    doc.push(Block::Paragraph(note));
    doc.push(Block::Table {
        columns: vec![
            col("Variant", false),
            col("Tensor", false),
            col("SQNR (dB)", true),
            col("Rel. Frobenius", true),
            col("Cosine", true),
        ],
        rows: report
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
            .collect(),
    });
    doc
}
