//! `cargo xtask tidy`: the docs kept true by a test, as rust-analyzer's `tidy` keeps its own. CI
//! runs it with the lints (`lint`); it reads the checkout's text and nothing else, in well under a
//! second. It fails, naming `file:line`, when:
//!
//! 1. **a code name** in one of [`NAMED_IN`] is in no Rust file. A backticked span is a code name
//!    when it is Rust identifiers joined by `::` (a trailing `()`/`(..)` and `<…>` generics
//!    dropped) and, if it is one identifier, it looks like an item: `CamelCase` (a type, a
//!    trait, a variant), or with a `_` (`snake_case` functions and fields, `SCREAMING_CASE`
//!    constants and the environment variables qdrift reads, which its code names in strings). A
//!    lowercase word without `_` (`cpu`, `gate`) is too common to tell. Each identifier of the
//!    name must be a word of some `.rs` file under `crates/`, `xtask/` or `tests/` (code,
//!    strings or comments, this file left out); a `snake_case` one may instead be a word of the
//!    data under `schema/`, `eval-sets/` or `reports/` (a JSON or TOML key). Not names: CLI flags
//!    (`--x`), anything with a space (a command), a `.` (a file, or a JSON path such as
//!    `reference.kl`), `=`, `@` (`kld@100`: a metric at a horizon) or `-` (`int4-g128`: a
//!    scheme). [`ALLOWED_NAMES`] lists the few true exceptions, each with its reason.
//! 2. **a path** named there does not exist: a Markdown link's target (from the doc's folder,
//!    anchor dropped, URLs skipped), or a backticked span without spaces that starts with a
//!    top-level entry of the repository (`crates/eval/src/run.rs`, `docs/`, `.ci/run`), or has a
//!    `/` and a source file's extension, or ends in `.rs`. Such a span exists when it is a path
//!    from the root or from the doc's folder, or the trailing components of some file or folder
//!    of the repository (a crate's paragraph says `host/placement.rs`). A placeholder component
//!    (`TARGET`, `<target>`, `*`) ends the path checked. Paths outside the checkout (`../shared`,
//!    `/var/tmp/…`, `~/.cache/…`) and other bare file names (`report.json`, a user's output)
//!    are not checked.
//! 3. **a measured figure** is written outside `docs/BENCHMARKS.md`, `reports/` and a
//!    `CHANGELOG`: in any other Markdown file (code spans left out, fenced blocks included) or in
//!    a comment of a `.rs` or `.toml` file (code and string literals are not read, so limits and
//!    defaults in code are never flagged). A measured figure is, narrowly, a number, a space and a
//!    unit of time (`s`, `ms`, `min`, `minutes`, `h`, …) or speed (`tokens/s`, `GB/s`, …); a
//!    number with a fraction directly followed by `×` or `x` (`4.27×`; a whole `8×` is a factor,
//!    not a measurement); or a number, a space and a size unit (`GiB`, `MB`, …) on a line that
//!    says, or follows one that says, `measured` or `RSS` (other sizes are arithmetic:
//!    a table's bytes, a buffer limit). A figure is a bound or a setting, not a measurement, when
//!    one of the two words before it is one of [`BOUND_WORDS`] (`at most 20 s`, `every 30 s`)
//!    or the word after it is `per`, `default`, `bound`, `limit` or `timeout`. Such a figure
//!    belongs in `docs/BENCHMARKS.md` with its date, commit and machine, and the place that used
//!    it points there. A figure that must stay where it is carries [`MARKER`] on its line, with a
//!    pointer to `docs/BENCHMARKS.md`; none does today. The README's example table is a report
//!    excerpt (metric values, no units), which this definition does not count.
//! 4. **`ARCHITECTURE.md` is longer than [`ARCHITECTURE_MAX_WORDS`]** words (whitespace-separated,
//!    as `wc -w` counts), or a paragraph of its `## Code map` (a `###` section) is longer than
//!    [`CODE_MAP_MAX_WORDS`] or states no `**Invariant`: the map stays a map.

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

/// The docs whose code names and paths are checked.
pub const NAMED_IN: [&str; 3] = ["ARCHITECTURE.md", "README.md", "docs/REFERENCE.md"];

/// ARCHITECTURE.md's length limit, in words.
pub const ARCHITECTURE_MAX_WORDS: usize = 4000;

/// The length limit of one crate's paragraph in ARCHITECTURE.md's code map, in words.
pub const CODE_MAP_MAX_WORDS: usize = 150;

/// On a line, allows a measured figure that must stay there (say why, and point to
/// docs/BENCHMARKS.md).
pub const MARKER: &str = "tidy:measured";

/// Code names the docs may use although no Rust file has them, each with its reason.
pub const ALLOWED_NAMES: &[(&str, &str)] = &[(
    "manylinux_2_35",
    "README.md: the wheel's platform tag, a Python packaging name that maturin derives from the build machine's glibc",
)];

/// Words that make the figure after them a bound or a setting rather than a measurement.
pub const BOUND_WORDS: &[&str] = &[
    "most", "least", "under", "within", "below", "above", "over", "past", "every", "per", "default", "limit", "cap",
    "capped", "bound", "budget", "timeout", "target", "max", "min", "≤", "≥", "<", ">", "=", "<=", ">=",
];

/// Words after a figure that make it a bound or a setting.
const BOUND_WORDS_AFTER: &[&str] = &["per", "default", "bound", "limit", "timeout"];

/// Units of time and speed: a number followed by one is a measured figure.
const TIME_AND_SPEED_UNITS: &[&str] = &[
    "ns",
    "µs",
    "us",
    "ms",
    "s",
    "sec",
    "second",
    "seconds",
    "min",
    "mins",
    "minute",
    "minutes",
    "CPU-minutes",
    "h",
    "hour",
    "hours",
    "tok/s",
    "token/s",
    "tokens/s",
    "GB/s",
    "GiB/s",
    "MB/s",
    "MiB/s",
    "TB/s",
];

/// Units of size: measured figures only on a line that says it measured them ([`SIZE_CUES`]).
const SIZE_UNITS: &[&str] = &["KiB", "MiB", "GiB", "TiB", "kB", "KB", "MB", "GB", "TB"];

/// Words that make a size on their line (or the next) a measured one.
const SIZE_CUES: &[&str] = &["measured", "RSS"];

/// Folders the walk skips: build output, downloads, VCS data.
const SKIPPED_DIRS: &[&str] = &[".git", "target", "models", ".dev", ".gl", "node_modules"];

/// Extensions that make a backticked span with a `/` a path to check.
const SOURCE_EXTENSIONS: &[&str] =
    &["rs", "md", "toml", "json", "jsonl", "yaml", "yml", "sh", "py", "html", "png", "svg", "lock", "txt"];

/// One problem: where, and what.
#[derive(Debug, PartialEq)]
struct Finding {
    file: String,
    line: usize,
    what: String,
}

/// What the checks read of the repository: its paths and the words of its code and data.
struct Repo {
    root: PathBuf,
    /// Every file and folder, relative to the root, `/`-separated.
    paths: BTreeSet<String>,
    /// The names at the root (`crates`, `README.md`, `.ci`).
    top: BTreeSet<String>,
    /// The words of every `.rs` file under `crates/`, `xtask/` and `tests/` but this one.
    code_words: HashSet<String>,
    /// The words of the JSON and TOML data under `schema/`, `eval-sets/` and `reports/`.
    data_words: HashSet<String>,
}

/// `cargo xtask tidy`: every check, every finding printed, an error if there is one.
pub fn check(root: &Path) -> Result<(), String> {
    let start = std::time::Instant::now();
    let repo = Repo::scan(root)?;
    let mut findings = Vec::new();
    for doc in NAMED_IN {
        let text = repo.read(doc)?;
        findings.extend(names_and_paths(&repo, doc, &text));
    }
    let mut figures_in = 0;
    for file in &repo.paths {
        let comments = match extension(file) {
            Some("md") if !figures_allowed(file) => markdown_prose(&repo.read(file)?),
            Some("rs") if !figures_allowed(file) => rust_comments(&repo.read(file)?),
            Some("toml") if !figures_allowed(file) => toml_comments(&repo.read(file)?),
            _ => continue,
        };
        figures_in += 1;
        findings.extend(measured_figures(file, &comments));
    }
    let architecture = repo.read("ARCHITECTURE.md")?;
    let words = word_count(&architecture);
    if words > ARCHITECTURE_MAX_WORDS {
        findings.push(Finding {
            file: "ARCHITECTURE.md".into(),
            line: 1,
            what: format!(
                "{words} words, more than {ARCHITECTURE_MAX_WORDS}: keep the map short, detail in the crates' docs"
            ),
        });
    }
    findings.extend(code_map_findings(&architecture));
    println!(
        "xtask: tidy: names and paths in {}, figures in {figures_in} files, ARCHITECTURE.md {words} words ({:.2} s)",
        NAMED_IN.join(", "),
        start.elapsed().as_secs_f64()
    );
    if findings.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = findings.iter().map(|f| format!("{}:{}: {}", f.file, f.line, f.what)).collect();
    Err(format!("tidy: {} problems (xtask/src/tidy.rs says what each check means):\n{}", lines.len(), lines.join("\n")))
}

/// Whether measured figures may be written in `file` (relative to the root).
fn figures_allowed(file: &str) -> bool {
    let name = file.rsplit('/').next().unwrap_or(file);
    file == "docs/BENCHMARKS.md" || file.starts_with("reports/") || name.starts_with("CHANGELOG")
}

/// The extension of a file name, if any.
fn extension(file: &str) -> Option<&str> {
    let name = file.rsplit('/').next().unwrap_or(file);
    name.rsplit_once('.').map(|(_, ext)| ext).filter(|_| !name.starts_with('.') || name.matches('.').count() > 1)
}

impl Repo {
    /// Walks the checkout (skipping [`SKIPPED_DIRS`]) and reads the words of its code and data.
    fn scan(root: &Path) -> Result<Repo, String> {
        let mut paths = BTreeSet::new();
        let mut pending = vec![String::new()];
        while let Some(dir) = pending.pop() {
            let full = root.join(&dir);
            let entries = std::fs::read_dir(&full).map_err(|e| format!("{}: {e}", full.display()))?;
            for entry in entries.filter_map(Result::ok) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let rel = if dir.is_empty() { name.clone() } else { format!("{dir}/{name}") };
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                if is_dir && SKIPPED_DIRS.contains(&name.as_str()) {
                    continue;
                }
                if is_dir {
                    pending.push(rel.clone());
                }
                paths.insert(rel);
            }
        }
        let top = paths.iter().filter(|p| !p.contains('/')).cloned().collect();
        let mut repo =
            Repo { root: root.to_path_buf(), paths, top, code_words: HashSet::new(), data_words: HashSet::new() };
        let code = ["crates/", "xtask/", "tests/"];
        let data = ["schema/", "eval-sets/", "reports/"];
        for path in &repo.paths {
            let ext = extension(path);
            let words = if ext == Some("rs") && code.iter().any(|c| path.starts_with(c)) && path != "xtask/src/tidy.rs"
            {
                &mut repo.code_words
            } else if matches!(ext, Some("json" | "jsonl" | "toml")) && data.iter().any(|d| path.starts_with(d)) {
                &mut repo.data_words
            } else {
                continue;
            };
            let text = std::fs::read(root.join(path)).map_err(|e| format!("{path}: {e}"))?;
            for word in String::from_utf8_lossy(&text).split(|c: char| !(c.is_alphanumeric() || c == '_')) {
                if !word.is_empty() && !words.contains(word) {
                    words.insert(word.to_string());
                }
            }
        }
        Ok(repo)
    }

    /// A file's text, by its path from the root.
    fn read(&self, file: &str) -> Result<String, String> {
        std::fs::read_to_string(self.root.join(file)).map_err(|e| format!("{file}: {e}"))
    }

    /// Whether `path`, named in `doc`, is a path from the root or from the doc's folder, or the
    /// trailing components of some path of the repository.
    fn has_path(&self, doc: &str, path: &str) -> bool {
        let path = path.trim_end_matches('/');
        let doc_dir = Path::new(doc).parent().unwrap_or(Path::new(""));
        let suffix = format!("/{path}");
        self.root.join(path).exists()
            || self.root.join(doc_dir).join(path).exists()
            || self.paths.iter().any(|p| p.ends_with(&suffix))
    }

    /// Whether every identifier of a code name is a word of the code (or, for one `snake_case`
    /// identifier, of the data).
    fn has_name(&self, segments: &[&str]) -> bool {
        let data_key = segments.len() == 1 && !segments[0].chars().any(|c| c.is_uppercase());
        segments.iter().all(|s| self.code_words.contains(*s)) || (data_key && self.data_words.contains(segments[0]))
    }
}

/// Findings of checks 1 and 2 in one doc.
fn names_and_paths(repo: &Repo, doc: &str, text: &str) -> Vec<Finding> {
    let mut findings = Vec::new();
    let finding = |line, what| Finding { file: doc.to_string(), line, what };
    for (line, target) in link_targets(text) {
        let doc_dir = Path::new(doc).parent().unwrap_or(Path::new(""));
        if !repo.root.join(doc_dir).join(&target).exists() {
            findings.push(finding(line, format!("link to `{target}`, which does not exist")));
        }
    }
    for (line, span) in inline_code(text) {
        if let Some(segments) = code_name(&span) {
            let allowed = ALLOWED_NAMES.iter().any(|(name, _)| *name == span);
            if !allowed && !repo.has_name(&segments) {
                let missing: Vec<&str> = segments.iter().copied().filter(|s| !repo.code_words.contains(*s)).collect();
                findings.push(finding(line, format!("`{span}`: no .rs file has `{}`", missing.join("`, `"))));
            }
        } else if let Some(path) = path_named(&span, &repo.top)
            && !repo.has_path(doc, &path)
        {
            findings.push(finding(line, format!("`{span}`: no such path in the repository")));
        }
    }
    findings
}

/// The inline code spans of a Markdown text outside fenced blocks, each with the line it starts
/// on (1-based). A span may run over a line break, as Markdown allows.
fn inline_code(text: &str) -> Vec<(usize, String)> {
    let mut spans = Vec::new();
    for (first_line, block) in prose_blocks(text) {
        let b: Vec<char> = block.chars().collect();
        let mut i = 0;
        while i < b.len() {
            if b[i] != '`' {
                i += 1;
                continue;
            }
            let run = b[i..].iter().take_while(|c| **c == '`').count();
            let open = i + run;
            let close = (open..b.len())
                .find(|&j| b[j] == '`' && b[j..].iter().take_while(|c| **c == '`').count() == run && b[j - 1] != '`');
            match close {
                Some(j) => {
                    let line = first_line + b[..i].iter().filter(|c| **c == '\n').count();
                    let span: String = b[open..j].iter().collect();
                    spans.push((line, span.split_whitespace().collect::<Vec<_>>().join(" ")));
                    i = j + run;
                }
                None => i = open,
            }
        }
    }
    spans
}

/// A Markdown text's paragraphs outside fenced code blocks, each with its first line's number.
fn prose_blocks(text: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let (mut fenced, mut current, mut start) = (false, String::new(), 1);
    for (n, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~");
        if fence {
            fenced = !fenced;
        }
        if fence || fenced || line.trim().is_empty() {
            if !current.is_empty() {
                blocks.push((start, std::mem::take(&mut current)));
            }
            continue;
        }
        if current.is_empty() {
            start = n + 1;
        } else {
            current.push('\n');
        }
        current.push_str(line);
    }
    if !current.is_empty() {
        blocks.push((start, current));
    }
    blocks
}

/// The local targets of a Markdown text's links and images (`[text](target)`), anchors
/// dropped, outside code; URLs and links within the page are left out.
fn link_targets(text: &str) -> Vec<(usize, String)> {
    let mut targets = Vec::new();
    for (first_line, block) in prose_blocks(text) {
        let block = blank_code_spans(&block);
        let mut rest = block.as_str();
        let mut offset = 0;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split('#').next().unwrap_or("").trim();
            let line = first_line + block[..offset + at].matches('\n').count();
            if !target.is_empty() && !target.contains("://") && !target.starts_with("mailto:") {
                targets.push((line, target.to_string()));
            }
            offset += at + 2;
            rest = after;
        }
    }
    targets
}

/// `text` with the contents of its inline code spans blanked (line breaks kept).
fn blank_code_spans(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut inside: Option<usize> = None;
    let b: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < b.len() {
        if b[i] == '`' {
            let run = b[i..].iter().take_while(|c| **c == '`').count();
            match inside {
                None if b[i + run..].windows(run).any(|w| w.iter().all(|c| *c == '`')) => inside = Some(run),
                Some(open) if open == run => inside = None,
                _ => {}
            }
            out.extend(std::iter::repeat_n('`', run));
            i += run;
            continue;
        }
        out.push(if inside.is_some() && b[i] != '\n' { ' ' } else { b[i] });
        i += 1;
    }
    out
}

/// The identifiers to look up if a backticked span is a code name (see the module doc).
fn code_name(span: &str) -> Option<Vec<&str>> {
    let mut name = span;
    for call in ["()", "(..)", "(…)", "(...)"] {
        name = name.strip_suffix(call).unwrap_or(name);
    }
    if name.ends_with('>') {
        name = &name[..name.find('<')?];
    }
    let segments: Vec<&str> = name.split("::").collect();
    let ident = |s: &str| {
        s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    if !segments.iter().all(|s| ident(s)) {
        return None;
    }
    if segments.len() > 1 {
        return Some(segments);
    }
    let camel = name.starts_with(|c: char| c.is_ascii_uppercase()) && name.chars().any(|c| c.is_ascii_lowercase());
    (camel || name.contains('_')).then_some(segments)
}

/// The path to check if a backticked span names a path of the repository (see the module doc),
/// up to its first placeholder component.
fn path_named(span: &str, top: &BTreeSet<String>) -> Option<String> {
    let outside = ["-", "/", "~", "$", "..", "http"];
    if span.contains(char::is_whitespace) || outside.iter().any(|p| span.starts_with(p)) {
        return None;
    }
    if span.contains(['=', '|', '@', ',', ':', '(', '[', '\'', '"']) {
        return None;
    }
    let first = span.split('/').next().unwrap_or(span);
    let ext = extension(span.trim_end_matches('/'));
    let rooted = top.contains(first);
    let source = span.contains('/') && ext.is_some_and(|e| SOURCE_EXTENSIONS.contains(&e));
    if !(rooted || source || ext == Some("rs")) {
        return None;
    }
    let placeholder = |c: &str| {
        c.contains(['<', '>', '*', '{', '}', '…'])
            || (c.len() > 1
                && !c.contains('.')
                && c.chars().all(|ch| ch.is_ascii_uppercase() || ch.is_ascii_digit() || ch == '_'))
    };
    let kept: Vec<&str> = span.split('/').take_while(|c| !placeholder(c)).collect();
    let path = kept.join("/");
    (!path.trim_end_matches('/').is_empty()).then_some(path)
}

/// Findings of check 3 in one file's prose (`(line, text)` pairs, in order).
fn measured_figures(file: &str, prose: &[(usize, String)]) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut previous = (0, "");
    for (line, text) in prose {
        let before = if previous.0 + 1 == *line { previous.1 } else { "" };
        if !text.contains(MARKER)
            && let Some(figure) = measured_figure(text, before)
        {
            findings.push(Finding {
                file: file.to_string(),
                line: *line,
                what: format!(
                    "measured figure \"{figure}\": move it to docs/BENCHMARKS.md (with date, commit, machine) and point there"
                ),
            });
        }
        previous = (*line, text);
    }
    findings
}

/// The first measured figure in a line of prose (see the module doc); `before` is the line
/// before it, whose words may say a size was measured.
fn measured_figure(text: &str, before: &str) -> Option<String> {
    let c: Vec<char> = text.chars().collect();
    let size_measured = SIZE_CUES.iter().any(|cue| text.contains(cue) || before.contains(cue));
    let mut i = 0;
    while i < c.len() {
        let starts =
            c[i].is_ascii_digit() && (i == 0 || !(c[i - 1].is_alphanumeric() || matches!(c[i - 1], '_' | '.')));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        let mut fraction = false;
        while j < c.len()
            && (c[j].is_ascii_digit()
                || (matches!(c[j], '.' | ',') && c.get(j + 1).is_some_and(char::is_ascii_digit) && j > i))
        {
            fraction |= c[j] == '.';
            j += 1;
        }
        // An exponent (`1e-3`) is part of the number.
        let sign = usize::from(matches!(c.get(j + 1), Some('-' | '+')));
        if matches!(c.get(j), Some('e' | 'E')) && c.get(j + 1 + sign).is_some_and(char::is_ascii_digit) {
            j += 1 + sign;
            while c.get(j).is_some_and(char::is_ascii_digit) {
                j += 1;
            }
        }
        let number: String = c[i..j].iter().collect();
        let next = c.get(j).copied();
        let after_ratio = c.get(j + 1).is_none_or(|n| !n.is_alphanumeric());
        let figure = if matches!(next, Some('×' | 'x')) && after_ratio && fraction {
            Some((format!("{number}{}", c[j]), j + 1))
        } else if next.is_some_and(|n| matches!(n, ' ' | '\u{a0}' | '\u{2009}' | '\u{202f}')) {
            let end =
                (j + 1..c.len()).find(|&k| !(c[k].is_alphabetic() || matches!(c[k], '/' | '-'))).unwrap_or(c.len());
            let unit: String = c[j + 1..end].iter().collect::<String>().trim_end_matches(['-', '/']).to_string();
            let counted =
                TIME_AND_SPEED_UNITS.contains(&unit.as_str()) || (size_measured && SIZE_UNITS.contains(&unit.as_str()));
            counted.then(|| (format!("{number} {unit}"), j + 1 + unit.chars().count()))
        } else {
            None
        };
        if let Some((figure, end)) = figure {
            let words_before: String = c[..i].iter().collect();
            let words_after: String = c[end..].iter().collect();
            if !is_bound(&words_before, &words_after) {
                return Some(figure);
            }
        }
        i = j.max(i + 1);
    }
    None
}

/// Whether the words around a figure make it a bound or a setting ([`BOUND_WORDS`]).
fn is_bound(before: &str, after: &str) -> bool {
    let clean = |w: &str| w.trim_matches(|c: char| matches!(c, '(' | ')' | ',' | ':' | ';' | '~' | '*')).to_lowercase();
    let last_two = before.split_whitespace().rev().take(2).map(clean).any(|w| BOUND_WORDS.contains(&w.as_str()));
    let next: Vec<String> = after.split_whitespace().take(2).map(clean).collect();
    let next_bound =
        next.first().is_some_and(|w| BOUND_WORDS_AFTER.contains(&w.as_str())) || next.iter().any(|w| w == "default");
    last_two || next_bound
}

/// A Markdown file's lines as prose for check 3: every line, fenced blocks included, with the
/// contents of inline code spans blanked.
fn markdown_prose(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") || line.trim_start().starts_with("~~~") {
            fenced = !fenced;
        }
        let prose = if fenced { line.to_string() } else { blank_code_spans(line) };
        lines.push((n + 1, prose));
    }
    lines
}

/// The comments of Rust source (`//`, `///`, `//!`, `/* */`), one entry per line they are on,
/// inline code spans blanked; string and char literals are skipped, not read as comments.
fn rust_comments(text: &str) -> Vec<(usize, String)> {
    let b: Vec<char> = text.chars().collect();
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut line = 1;
    let push = |line: usize, c: char, out: &mut Vec<(usize, String)>| match out.last_mut() {
        Some((l, s)) if *l == line => s.push(c),
        _ => out.push((line, c.to_string())),
    };
    let mut i = 0;
    while i < b.len() {
        let (c, next) = (b[i], b.get(i + 1).copied());
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                push(line, b[i], &mut out);
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    if depth == 0 {
                        i += 2;
                        break;
                    }
                }
                if b[i] == '\n' {
                    line += 1;
                } else {
                    push(line, b[i], &mut out);
                }
                i += 1;
            }
        } else {
            let end = literal_end(&b, i);
            line += b[i..end].iter().filter(|c| **c == '\n').count();
            i = end;
        }
    }
    out.into_iter().map(|(l, s)| (l, blank_code_spans(&s))).collect()
}

/// Where the token starting at `i` ends: past a string, raw string or char literal, else `i + 1`.
fn literal_end(b: &[char], i: usize) -> usize {
    let (c, next) = (b[i], b.get(i + 1).copied());
    // `br"…"` is a raw byte string; any other letter before `r` makes it an identifier.
    let ident = |k: usize| b[k].is_alphanumeric() || b[k] == '_';
    let ident_before = i > 0 && ident(i - 1) && !(b[i - 1] == 'b' && (i < 2 || !ident(i - 2)));
    if c == 'r' && matches!(next, Some('"' | '#')) && !ident_before {
        let hashes = b[i + 1..].iter().take_while(|c| **c == '#').count();
        let mut j = i + 1 + hashes;
        if b.get(j) != Some(&'"') {
            return i + 1;
        }
        j += 1;
        while j < b.len() {
            if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                return j + 1 + hashes;
            }
            j += 1;
        }
        b.len()
    } else if c == '"' {
        let mut j = i + 1;
        while j < b.len() && b[j] != '"' {
            j += if b[j] == '\\' { 2 } else { 1 };
        }
        (j + 1).min(b.len())
    } else if c == '\'' {
        // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a), which is passed over.
        let close = if next == Some('\\') {
            (i + 2..b.len().min(i + 12)).find(|&j| b[j] == '\'')
        } else if b.get(i + 2) == Some(&'\'') {
            Some(i + 2)
        } else {
            None
        };
        close.map_or(i + 1, |j| j + 1)
    } else {
        i + 1
    }
}

/// The comments of a TOML file (`#` outside a string), one entry per line.
fn toml_comments(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut quote: Option<char> = None;
        let mut escaped = false;
        for (at, c) in line.char_indices() {
            match quote {
                Some('"') if escaped => escaped = false,
                Some('"') if c == '\\' => escaped = true,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '"' || c == '\'' => quote = Some(c),
                None if c == '#' => {
                    out.push((n + 1, blank_code_spans(&line[at..])));
                    break;
                }
                None => {}
            }
        }
    }
    out
}

/// Check 4's findings in ARCHITECTURE.md's code map: a paragraph too long or without its
/// invariant.
fn code_map_findings(text: &str) -> Vec<Finding> {
    let mut findings = Vec::new();
    let mut section: Option<(usize, &str, usize, bool)> = None;
    let mut in_map = false;
    let mut close = |section: Option<(usize, &str, usize, bool)>| {
        let Some((line, title, words, invariant)) = section else { return };
        let mut problems = Vec::new();
        if words > CODE_MAP_MAX_WORDS {
            problems.push(format!("{words} words, more than {CODE_MAP_MAX_WORDS}"));
        }
        if !invariant {
            problems.push("no **Invariant".to_string());
        }
        if !problems.is_empty() {
            let what = format!("code map paragraph {title}: {}", problems.join("; "));
            findings.push(Finding { file: "ARCHITECTURE.md".into(), line, what });
        }
    };
    for (n, line) in text.lines().enumerate() {
        if line.starts_with("## ") {
            close(section.take());
            in_map = line.trim() == "## Code map";
        } else if let Some(title) = line.strip_prefix("### ").filter(|_| in_map) {
            close(section.replace((n + 1, title, 0, false)));
        } else if let Some((_, _, words, invariant)) = section.as_mut() {
            *words += word_count(line);
            *invariant |= line.contains("**Invariant");
        }
    }
    close(section);
    findings
}

/// Words as `wc -w` counts them.
fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top() -> BTreeSet<String> {
        ["crates", "docs", "xtask", "tests", "README.md", ".ci"].iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn code_names_are_rust_items() {
        assert_eq!(code_name("HostModel"), Some(vec!["HostModel"]));
        assert_eq!(code_name("Llama::from_host_owned"), Some(vec!["Llama", "from_host_owned"]));
        assert_eq!(code_name("open_source"), Some(vec!["open_source"]));
        assert_eq!(code_name("Scheme::all()"), Some(vec!["Scheme", "all"]));
        assert_eq!(code_name("LoadedModel<W>"), Some(vec!["LoadedModel"]));
        assert_eq!(code_name("SCHEMA_VERSION"), Some(vec!["SCHEMA_VERSION"]));
        for not_a_name in
            ["cpu", "--allow-long", "cargo xtask tidy", "report.json", "reference.kl", "kld@100", "int4-g128", "x·w"]
        {
            assert_eq!(code_name(not_a_name), None, "{not_a_name}");
        }
    }

    #[test]
    fn paths_are_the_repositorys() {
        let top = top();
        let path = |s| path_named(s, &top);
        assert_eq!(path("crates/eval/src/run.rs").as_deref(), Some("crates/eval/src/run.rs"));
        assert_eq!(path("docs/").as_deref(), Some("docs/"));
        assert_eq!(path(".ci/run").as_deref(), Some(".ci/run"));
        assert_eq!(path("host/placement.rs").as_deref(), Some("host/placement.rs"));
        assert_eq!(path("compat.rs").as_deref(), Some("compat.rs"));
        assert_eq!(path("tests/fuzz/crashes/TARGET/").as_deref(), Some("tests/fuzz/crashes"));
        assert_eq!(path("tests/fuzz/crashes/<target>/x.rs").as_deref(), Some("tests/fuzz/crashes"));
        for not_checked in
            ["report.json", "../shared", "/var/tmp/qdrift-target", "~/.cache/qdrift", "auto/wgpu/cpu", "--out/x", "hf/"]
        {
            assert_eq!(path(not_checked), None, "{not_checked}");
        }
    }

    #[test]
    fn inline_code_and_links_skip_fenced_blocks() {
        let md = "A `HostModel` and `cargo xtask\nbench gpu`.\n\n```sh\nqdrift `x`\n```\nSee [the map](ARCHITECTURE.md#code-map), [site](https://x.y) and `[no](link.md)`.\n";
        assert_eq!(
            inline_code(md),
            [(1, "HostModel".to_string()), (1, "cargo xtask bench gpu".to_string()), (7, "[no](link.md)".to_string())]
        );
        assert_eq!(link_targets(md), [(7, "ARCHITECTURE.md".to_string())]);
    }

    #[test]
    fn measured_figures_are_timings_speeds_ratios_and_measured_sizes() {
        let figure = |s| measured_figure(s, "");
        assert_eq!(figure("a cold build takes ~12 minutes on 2 cores").as_deref(), Some("12 minutes"));
        assert_eq!(figure("(about 40 s on 2 cores)").as_deref(), Some("40 s"));
        assert_eq!(figure("took 26.4 s with them").as_deref(), Some("26.4 s"));
        assert_eq!(figure("215 → 261 tokens/s").as_deref(), Some("261 tokens/s"));
        assert_eq!(figure("a step of 1e-3 seconds").as_deref(), Some("1e-3 seconds"));
        assert_eq!(figure("qdrift batched is 4.27× llama.cpp").as_deref(), Some("4.27×"));
        assert_eq!(figure("measured peak RSS 3.19 GiB").as_deref(), Some("3.19 GiB"));
        assert_eq!(figure("the peak is 2.5 GB plus the embedding"), None, "a size worked out");
        assert_eq!(measured_figure("1.24B bf16 folder, 3.39 GiB).", "(measured: a").as_deref(), Some("3.39 GiB"));
        for not_measured in [
            "at most 20 s",
            "every 30 s, with the time left",
            "a watchdog (3 s by default)",
            "lavapipe allows 128 MiB in one buffer",
            "an 8× outlier",
            "batched ≥ 2.5× llama.cpp",
            "blocks in 32s too",
            "16 prompts × 128 tokens",
            "x86_64 and Q4_1, 1,030 positions, 1e9 parameters",
        ] {
            assert_eq!(figure(not_measured), None, "{not_measured}");
        }
        assert_eq!(figure(&blank_code_spans("a time left reads `45 s` or `12 min`")), None, "code is not prose");
    }

    #[test]
    fn figures_are_read_in_comments_only() {
        let rust = "/// Took 3.9 s.\nconst T: &str = \"20 s\"; // about 2 minutes\nlet c = '\"'; /* 5 s\n 6 h */ let r = r#\"// 7 s\"#;\n";
        let comments = rust_comments(rust);
        assert_eq!(comments.iter().map(|(l, _)| *l).collect::<Vec<_>>(), [1, 2, 3, 4]);
        let found: Vec<Finding> = measured_figures("a.rs", &comments);
        assert_eq!(found.iter().map(|f| f.line).collect::<Vec<_>>(), [1, 2, 3, 4]);
        assert!(!comments.iter().any(|(_, s)| s.contains("7 s") || s.contains("20 s")));
        let toml = "[a]\nb = \"#1 s\" # took 2 s\n# 4.5 s, measured tidy:measured (docs/BENCHMARKS.md)\n";
        let found = measured_figures("Cargo.toml", &toml_comments(toml));
        assert_eq!(found.iter().map(|f| f.line).collect::<Vec<_>>(), [2], "the marker allows line 3");
        let md = "took `3 s` here\n```sh\ncargo build   # about 12 minutes\n```\n";
        assert_eq!(measured_figures("README.md", &markdown_prose(md)).len(), 1);
        assert!(figures_allowed("docs/BENCHMARKS.md") && figures_allowed("reports/x/report.md"));
        assert!(!figures_allowed("README.md") && !figures_allowed("docs/REFERENCE.md"));
    }

    #[test]
    fn words_are_counted_as_wc_does() {
        assert_eq!(word_count("# Architecture\n\nOne `map`, short.\n"), 5);
    }

    #[test]
    fn code_map_paragraphs_are_short_and_state_their_invariant() {
        let long = "word ".repeat(CODE_MAP_MAX_WORDS);
        let md = format!(
            "## Code map\n### `a`\nShort.\n**Invariant: none.**\n### `b`\n{long}\n**Invariant: x.**\n### `c`\nNo rule.\n## Next\n### `d`\nNot in the map.\n"
        );
        let found: Vec<(usize, String)> = code_map_findings(&md).into_iter().map(|f| (f.line, f.what)).collect();
        assert_eq!(
            found,
            [
                (5, "code map paragraph `b`: 152 words, more than 150".to_string()),
                (8, "code map paragraph `c`: no **Invariant".to_string()),
            ]
        );
    }
}
