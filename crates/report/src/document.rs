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
use crate::gate::{CheckResult, GateOutcome, Verdict};
use crate::metrics::{Group, METRICS, Metric, Placement, metric};
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
    /// A link to a heading of the report (`href` is its id, without the `#`).
    Link {
        /// The link's text, written by qdrift.
        text: String,
        /// The target heading's id.
        href: &'static str,
    },
}

/// One cell: a sequence of runs.
pub(crate) type Cell = Vec<Inline>;

/// A table column.
#[derive(Clone, Debug)]
pub(crate) struct Column {
    pub title: String,
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
    /// Blocks folded away behind a one-line summary (`<details>` in both printers).
    Details {
        summary: String,
        blocks: Vec<Block>,
    },
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

fn col(title: impl Into<String>, numeric: bool) -> Column {
    Column { title: title.into(), numeric }
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
    if let Some(routers) = routers_words(report) {
        line.push(text(format!(" · {routers}")));
    }
    line
}

/// What the workload line says of a mixture of experts' routers: for a report with routing,
/// whether the scheme variants kept them at the reference's precision; for a run that quantized
/// them, that it did. `None` for a dense model and for an older report, which does not say.
fn routers_words(report: &Report) -> Option<&'static str> {
    let routed = report.variants.iter().any(|v| v.routing.is_some());
    match report.workload.quantize_router {
        Some(true) => Some("routers quantized with the weights (--quantize-router)"),
        Some(false) if routed => Some("routers at reference precision"),
        _ => None,
    }
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

/// The whole document, section by section: the verdict first (with the gate's outcome when
/// the run was gated), then what was run, the numbers, and the glossary.
pub(crate) fn document(report: &Report, gate: Option<&GateOutcome>) -> Vec<Block> {
    let mut doc = vec![Block::Heading { level: 1, id: "qdrift-report".into(), text: "qdrift report".into() }];
    doc.extend(verdict_section(report, gate, true));
    doc.push(Block::Paragraph(workload_line(report)));
    doc.push(Block::Paragraph(reference_line(report)));
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
    if let Some(stored) = &report.model.stored_dtype {
        line.push(text(", from a checkpoint stored in "));
        line.push(Inline::Name(stored.clone()));
    }
    if !r.self_perplexity.is_empty() {
        let ppl: Vec<String> = r.self_perplexity.iter().map(|(h, p)| format!("{} @{h}", rate(*p))).collect();
        line.push(text(format!("; perplexity of its own continuations {}", ppl.join(", "))));
    }
    match &r.kl {
        Some(crate::KlMethod::TopKTail { top_k, tail_mass_max, tail_mass_mean }) => line.push(text(format!(
            ". KL divergence against its top-{top_k} log-probabilities plus one tail bucket per position \
             (tail mass mean {tail_mass_mean:.2e}, max {tail_mass_max:.2e}): the KL divergences both ways are lower \
             bounds of the exact ones and the acceptance α (with the sampling tokens per step) an upper bound; the \
             top-K overlaps up to K = {top_k} and every other metric are exact"
        ))),
        Some(crate::KlMethod::Exact) => line.push(text(". KL divergence over the full vocabulary")),
        None => {}
    }
    line.push(text("."));
    line
}

/// What a variant's weights are: the recipe's or the checkpoint's weight format, else the scheme
/// or the checkpoint's file name; a checkpoint's file with its short SHA-256.
fn weights_cell(v: &Variant) -> Cell {
    let what = v.recipe.as_ref().map(|r| r.weights.as_str()).or(v.scheme.as_deref());
    let file = v.path.as_deref().map(file_name);
    let mut runs = vec![Inline::Name(what.or(file).unwrap_or("—").to_string())];
    if let (Some(_), Some(file)) = (what, file) {
        runs.push(text(" in "));
        runs.push(Inline::Code(file.to_string()));
    }
    if let Some(h) = &v.sha256 {
        runs.push(text(" (sha256 "));
        runs.push(Inline::Name(short_sha256(h)));
        runs.push(text(")"));
    }
    runs
}

/// A recipe's activation rounding, and for static input scales how many prompts calibrated them.
fn activations_cell(recipe: Option<&crate::schema::RecipeParts>) -> Cell {
    let Some(activations) = recipe.and_then(|r| r.activations.as_ref()) else { return cell("—") };
    let mut runs = vec![Inline::Name(activations.clone())];
    if let Some(n) = recipe.and_then(|r| r.calibration_prompts) {
        let prompts = if n == 1 { "prompt" } else { "prompts" };
        runs.push(text(format!(" (input scales calibrated on {n} {prompts})")));
    }
    runs
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
                weights_cell(v),
                activations_cell(r),
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
/// its interval: one table per [`Group`] that has a shown metric, so that no table is wider than
/// a page.
fn horizon_section(report: &Report, h: usize) -> Vec<Block> {
    let intro = "Means over prompts with their 95% intervals [lo, hi]; the glossary (Metrics, at the end) defines \
                 each column. Excess = variant − noise floor, paired by prompt; the noise floor has none.";
    let shown = shown_metrics(report);
    let mut blocks = vec![
        heading(&format!("horizon-{h}"), format!("First {h} generated tokens")),
        Block::Paragraph(vec![text(intro)]),
    ];
    for group in Group::ALL {
        let in_group: Vec<&Metric> = shown.iter().copied().filter(|m| m.group == group).collect();
        if in_group.is_empty() {
            continue;
        }
        let rows = report
            .variants_grouped()
            .into_iter()
            .filter_map(|v| v.horizon(h).map(|m| metric_row(&in_group, v, m)))
            .collect();
        blocks.push(Block::Paragraph(vec![Inline::Strong(group.title().into())]));
        blocks.push(Block::Table { columns: metric_columns(&in_group), rows });
    }
    blocks
}

/// The title of `m`'s p99 column: its [`Metric::tail`], unless `shown` has the metric `NAME_p99`,
/// which gives the same number with its interval (reports written before it have only the tail).
fn tail_column(shown: &[&Metric], m: &Metric) -> Option<&'static str> {
    let p99 = format!("{}_p99", m.name);
    m.tail.filter(|_| !shown.iter().any(|s| s.name == p99))
}

/// `Variant`, then per metric of `shown` its title (and its p99 column, if it has one:
/// [`tail_column`]).
fn metric_columns(shown: &[&Metric]) -> Vec<Column> {
    let mut columns = vec![col("Variant", false)];
    for m in shown {
        columns.push(col(m.title, true));
        columns.extend(tail_column(shown, m).map(|title| col(title, true)));
    }
    columns
}

/// A row of [`metric_columns`] of `shown`: `—` for a metric the variant does not have.
fn metric_row(shown: &[&Metric], v: &Variant, h: &HorizonMetrics) -> Vec<Cell> {
    let mut row = vec![name_cell(&v.name)];
    for &m in shown {
        let value = h.get(m);
        row.push(cell(value.map_or_else(|| "—".to_string(), |e| m.with_ci(e))));
        if tail_column(shown, m).is_some() {
            let p99 = value.and_then(|e| e.distribution).map(|d| (m.format)(d.p99));
            row.push(cell(p99.unwrap_or_else(|| "—".to_string())));
        }
    }
    row
}

/// A Kaplan–Meier median position, 1-based as every rendering counts positions ([`position`]),
/// or `> H (not reached)` when more than half the prompts have no event within the longest
/// horizon `H`.
fn median_cell(median: Option<usize>, longest: usize) -> Cell {
    cell(median.map_or_else(|| format!("> {longest} (not reached)"), |t| position(t).to_string()))
}

/// The position a rendering shows for `report.json`'s 0-based position `t`: `t + 1`, so that
/// position 1 is the first generated token, as the charts' axes and the horizons count ("the
/// first 10 tokens" are positions 1 to 10).
pub(crate) fn position(t: usize) -> usize {
    t + 1
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
         (Kaplan–Meier median); censored prompts never diverged within {longest} tokens. Positions count from \
         1 in every table, chart and line of words of this report: position 1 is the first generated token \
         (report.json counts from 0)."
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
         quantization.{}",
        routers_sentence(report)
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

/// What the routing section says of the routers (`mlp.gate`), after its intro: kept at the
/// reference's precision, so a flip is the rounded hidden state reaching an unquantized router,
/// or quantized too (`--quantize-router`); and that a checkpoint's are as its file stores them.
/// Empty for an older report, which does not say.
fn routers_sentence(report: &Report) -> String {
    let mut words = match report.workload.quantize_router {
        Some(false) => " Every scheme variant kept the routers (mlp.gate) at the reference's precision, as \
                        llm-compressor and vLLM leave them: its flips come from the rounded hidden states reaching \
                        an unquantized router."
            .to_string(),
        Some(true) => " The scheme variants quantized the routers (mlp.gate) too (--quantize-router): their flips \
                       include the routers' own rounding."
            .to_string(),
        None => return String::new(),
    };
    if report.variants.iter().any(|v| v.kind == VariantKind::Checkpoint && v.routing.is_some()) {
        words.push_str(" A checkpoint variant's routers are as its file stores them.");
    }
    words
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
    let tensors: usize = report.variants.iter().map(|v| v.per_tensor_error.len()).sum();
    let mut blocks = vec![heading("per-tensor-error", "Per-tensor error"), Block::Paragraph(per_tensor_note(report))];
    if tensors > 0 {
        blocks.push(Block::Details {
            summary: format!("{tensors} tensors (unfold)"),
            blocks: vec![Block::Table { columns, rows }],
        });
    }
    blocks
}

/// What the per-tensor table holds, and why a variant has no rows: the noise floor and a
/// variant that leaves the weights at FP16 quantize none, and a checkpoint's tensors are read
/// already quantized, with no FP16 original of its own to measure them against.
fn per_tensor_note(report: &Report) -> Vec<Inline> {
    let mut note = vec![text(
        "Signal-to-quantization-noise ratio of each quantized weight tensor (\"exact\": reconstructed \
         exactly), relative Frobenius error and cosine similarity against the reference.",
    )];
    let without = |why: &str, pick: &dyn Fn(&Variant) -> bool| {
        let names: Vec<&str> = report
            .variants
            .iter()
            .filter(|v| v.per_tensor_error.is_empty() && pick(v))
            .map(|v| v.name.as_str())
            .collect();
        let mut runs = Vec::new();
        if !names.is_empty() {
            runs.push(text(format!(" {why}: ")));
            for (i, n) in names.iter().enumerate() {
                if i > 0 {
                    runs.push(text(", "));
                }
                runs.push(Inline::Name((*n).to_string()));
            }
            runs.push(text("."));
        }
        runs
    };
    note.extend(without("Weights not quantized (no rows)", &|v| v.kind != VariantKind::Checkpoint));
    note.extend(without(
        "Read already quantized from a checkpoint, so not measured tensor by tensor (its drift is in the tables above)",
        &|v| v.kind == VariantKind::Checkpoint,
    ));
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
        Block::Paragraph(vec![text(
            "Bits/weight (the Variants table): 8 × the bytes the variant's weight tensors are stored in, \
             over the weights they hold: llama.cpp's bits per weight of a file. A scheme's quantized \
             tensors count as stored (codes, scales, zero points) and the tensors it leaves alone at \
             FP16, as the reference holds them (qdrift quantize prints the same figure); a checkpoint's \
             tensors count as its files store them, metadata and tokenizer excluded (qdrift inspect \
             prints the same figure).",
        )]),
    ]
}

/// The order the verdict lists the variants in: every variant but the noise floor, by `key` (excess
/// KLD over the noise floor, or the KLD mean when the run has none) over the longest horizon,
/// closest first; a variant without the value (one that failed) last.
pub(crate) struct Ranking<'a> {
    /// `excess_kld` or `kld`.
    pub key: &'static str,
    /// The longest horizon, the one ranked by.
    pub longest: usize,
    /// The ranked variants.
    pub variants: Vec<&'a Variant>,
}

impl<'a> Ranking<'a> {
    pub(crate) fn of(report: &'a Report) -> Ranking<'a> {
        let longest = report.workload.horizons.last().copied().unwrap_or(0);
        let floor = report.variants.iter().any(|v| v.kind == VariantKind::NoiseFloor);
        let key = if floor { "excess_kld" } else { "kld" };
        let mut variants: Vec<&Variant> =
            report.variants.iter().filter(|v| v.kind != VariantKind::NoiseFloor).collect();
        variants.sort_by(|a, b| {
            let x = |v: &Variant| v.horizon(longest).and_then(|h| h.metric(key)).map_or(f64::INFINITY, |e| e.mean);
            x(a).total_cmp(&x(b))
        });
        Ranking { key, longest, variants }
    }

    /// The title of the ranking metric (`Excess KLD`).
    pub(crate) fn key_title(&self) -> &'static str {
        metric(self.key).map_or(self.key, |m| m.title)
    }

    /// The ranking metric's mean of `v` over the longest horizon, in its format; `—` without one.
    pub(crate) fn value(&self, v: &Variant) -> String {
        let e = v.horizon(self.longest).and_then(|h| h.metric(self.key));
        metric(self.key).zip(e).map_or_else(|| "—".to_string(), |(m, e)| (m.format)(e.mean))
    }
}

/// The verdict, first: per variant (noise floor aside), ranked by excess KLD over the noise
/// floor over the longest horizon (by KLD mean when the run has no noise floor), its gate verdict
/// and the checks that did not pass when the run was gated, and one line of plain words
/// ([`in_words`]). `glossary`: end the introduction with a link to the glossary (the whole
/// report; a verdict printed alone has none).
pub(crate) fn verdict_section(report: &Report, gate: Option<&GateOutcome>, glossary: bool) -> Vec<Block> {
    let Ranking { key, longest, variants: ranked } = Ranking::of(report);
    let floor = report.variants.iter().find(|v| v.kind == VariantKind::NoiseFloor);
    let at_longest = |v: &Variant, name: &str| v.horizon(longest).and_then(|h| h.metric(name)).copied();
    let mut intro = Vec::new();
    // A variant of another model first: its numbers measure that model, not a quantization.
    for v in report.variants.iter().filter(|v| v.different_model.is_some()) {
        intro.push(Inline::Strong(format!("{} is not a quantization of the reference", crate::format::plain(&v.name))));
        intro.push(text(format!(
            " ({}); it was compared at the run's request (--allow-different-model), so its numbers measure \
             a different model. ",
            v.different_model.as_deref().unwrap_or_default()
        )));
    }
    if let Some(g) = gate {
        intro.push(Inline::Strong(format!("Gate: {}", g.verdict().word())));
        intro.push(text(format!(
            " — {} checks: {} passed, {} failed, {} inconclusive. ",
            g.results.len(),
            g.count(Verdict::Pass),
            g.count(Verdict::Fail),
            g.count(Verdict::Inconclusive)
        )));
    }
    let key_title = metric(key).map_or(key, |m| m.title);
    if let Some(stored) = &report.model.stored_dtype {
        // What "the reference" is, first: a bf16 and an FP16 reference of the same checkpoint
        // are different baselines.
        let r = &report.reference;
        intro.push(text(format!(
            "Reference: {} weights computing in {}, from a checkpoint stored in {stored}. ",
            crate::format::plain(&r.name),
            crate::format::plain(&r.compute_dtype)
        )));
    }
    intro.push(text(match floor {
        Some(f) => format!(
            "Variants ranked by {key_title} over the first {longest} tokens (lower is closer to the reference). \
             A variant's text is \"indistinguishable from the noise floor's\" over a horizon when the 95% \
             interval of its excess token match over the noise floor ({}) contains 0. ",
            crate::format::plain(&f.name)
        ),
        None => format!(
            "Variants ranked by {key_title} over the first {longest} tokens (lower is closer to the reference); \
             this run has no noise floor to compare with. "
        ),
    }));
    if let Some(f) = floor.and_then(|f| f.failure.as_ref().map(|why| (f, why))) {
        intro.push(text(format!(
            "The noise floor {} failed ({}), so no variant has an excess over it. ",
            crate::format::plain(&f.0.name),
            f.1
        )));
    }
    if glossary {
        intro.push(text("Every column is defined in the "));
        intro.push(Inline::Link { text: "glossary".into(), href: "metrics" });
        intro.push(text("."));
    }
    let mut columns = vec![col("#", true), col("Variant", false)];
    if gate.is_some() {
        columns.extend([col("Gate", false), col("Checks not passed", false)]);
    }
    columns.extend([
        col(format!("{key_title} ({longest} tokens)"), true),
        col(format!("Token match ({longest} tokens)"), true),
        col("In words", false),
    ]);
    let with_ci = |v: &Variant, name: &str| {
        let e = at_longest(v, name);
        cell(metric(name).zip(e).map_or_else(|| "—".to_string(), |(m, e)| m.with_ci(&e)))
    };
    let rows = ranked
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let mut row = vec![cell((i + 1).to_string()), name_cell(&v.name)];
            if let Some(g) = gate {
                row.push(cell(g.variant_verdict(&v.name).map_or("not gated", Verdict::word)));
                let open: Vec<String> =
                    g.results.iter().filter(|r| r.variant == v.name && !r.passed()).map(check_words).collect();
                row.push(cell(if open.is_empty() { "—".to_string() } else { open.join("; ") }));
            }
            row.push(with_ci(v, key));
            row.push(with_ci(v, "token_match_rate"));
            row.push(cell(in_words(report, v)));
            row
        })
        .collect();
    vec![heading("verdict", "Verdict"), Block::Paragraph(intro), Block::Table { columns, rows }]
}

/// A check that did not pass, briefly: `kld@1000: upper CI bound 0.0523 > max 0.05` or
/// `kld@100: [0.031, 0.062] straddles max 0.05, ~140 prompts would tell`.
fn check_words(r: &CheckResult) -> String {
    if r.failure.is_some() {
        return format!("{}: the variant failed", r.name());
    }
    let fmt = metric(&r.metric).map_or(rate as fn(f64) -> String, |m| m.format);
    let threshold = match r.side {
        crate::gate::Side::Min => format!("min {}", fmt(r.threshold)),
        crate::gate::Side::Max => format!("max {}", fmt(r.threshold)),
    };
    match r.verdict {
        Verdict::Inconclusive => {
            let more = r.prompts_needed().map_or_else(
                || "no prompt count would tell (the estimate is on the threshold)".to_string(),
                |n| format!("~{n} prompts would tell"),
            );
            format!("{}: [{}, {}] straddles {threshold}, {more}", r.name(), fmt(r.ci95[0]), fmt(r.ci95[1]))
        }
        _ => {
            let op = if r.side == crate::gate::Side::Min { "<" } else { ">" };
            format!("{}: {} {} {op} {threshold}", r.name(), r.value_kind(), fmt(r.value))
        }
    }
}

/// One line of plain words on a variant: up to which horizon its free-running text is
/// indistinguishable from the noise floor's (the excess token match's interval contains 0), by
/// which it diverges, and its median first divergence: `text indistinguishable from the noise
/// floor's up to 10 tokens; diverges by 100; half the prompts differ from the reference by
/// position 38`, the position 1-based ([`position`]); for a model with experts, when material
/// ([`MATERIAL_FLIPS`]), how often its top-1 expert flips (`; top-1 expert flips at 21% of routing
/// decisions`). (Excess KLD is not used: any change of the weights moves the distributions by
/// more than the noise floor's rounding, so it would call every variant distinguishable.)
pub(crate) fn in_words(report: &Report, v: &Variant) -> String {
    if let Some(f) = &v.failure {
        return format!("failed: {f}");
    }
    let other = if v.different_model.is_some() { "a different model, not a quantization: " } else { "" };
    let horizons = &report.workload.horizons;
    let longest = horizons.last().copied().unwrap_or(0);
    let indistinguishable = |h: usize| {
        let tm = v.horizon(h)?.metric("excess_token_match_rate")?;
        Some(tm.ci95[0] <= 0.0 && tm.ci95[1] >= 0.0)
    };
    let mut words = match horizons.iter().map(|&h| indistinguishable(h)).collect::<Option<Vec<bool>>>() {
        None => String::new(),
        Some(same) => match same.iter().position(|s| !s) {
            None => format!("text indistinguishable from the noise floor's up to {longest} tokens; "),
            Some(0) => format!("text diverges from the noise floor's within {} tokens; ", horizons[0]),
            Some(i) => format!(
                "text indistinguishable from the noise floor's up to {} tokens; diverges by {}; ",
                horizons[i - 1],
                horizons[i]
            ),
        },
    };
    words.push_str(&match v.first_divergence.median {
        Some(t) => format!("half the prompts differ from the reference by position {}", position(t)),
        None => format!("more than half the prompts match the reference for all {longest} tokens"),
    });
    let flips = v.horizon(longest).and_then(|h| h.metric("routing_flip_rate")).map(|e| e.mean);
    if let Some(flips) = flips.filter(|&f| f >= MATERIAL_FLIPS) {
        words.push_str(&format!("; top-1 expert flips at {} of routing decisions", percent(flips)));
    }
    format!("{other}{words}")
}

/// The routing flip rate from which a variant's line of words mentions it: one routing decision
/// in a hundred. Below it flips are few enough that the text's divergence says more (the example
/// MoE's noise floor, no quantization at all, flips 0.15%).
const MATERIAL_FLIPS: f64 = 0.01;

/// A share as a percentage: one decimal below 10% (`1.6%`), none from 10% (`21%`).
fn percent(x: f64) -> String {
    let p = 100.0 * x;
    if p < 10.0 { format!("{p:.1}%") } else { format!("{p:.0}%") }
}
