//! What `qdrift eval` says while it runs: plain progress lines for a log ([`PlainProgress`]),
//! with each model's and the whole run's time left, and the wall time per phase
//! (`--phase-times`, [`PhaseClock`]).

use qdrift_eval::Progress;

/// Progress as plain lines for a log: when a model starts generating, at each quarter of its
/// tokens and at least every [`PLAIN_PROGRESS_EVERY`] while it generates (tokens done, the seconds
/// since it started and the time left at that rate, then the whole run's: [`PlainProgress::run_left`]),
/// when it starts scoring and when it is done; warnings as they come. No time left is said before
/// a tenth of a model's tokens are done: the first steps carry its warm-up (kernel compilation,
/// the prompt pass), and a rate from them overstates the rest many times.
#[derive(Default)]
pub(crate) struct PlainProgress {
    model: String,
    tokens: u64,
    done: u64,
    quarter: u64,
    start: Option<std::time::Instant>,
    last: Option<std::time::Instant>,
    /// The models the run generates with: the reference, the noise floor and each variant.
    models: usize,
    /// Models done (generated and scored).
    finished: usize,
    /// When the first model started.
    run_start: Option<std::time::Instant>,
}

/// The longest a CI log waits for a progress line while a model generates.
const PLAIN_PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

impl PlainProgress {
    /// Progress lines for a run generating with `models` models.
    pub(crate) fn new(models: usize) -> PlainProgress {
        PlainProgress { models, ..PlainProgress::default() }
    }

    /// The whole run's time left, at the rate of the time spent so far per model (generation,
    /// scoring and building alike): `None` before a tenth of the first model's tokens.
    fn run_left(&self, now: std::time::Instant) -> Option<f64> {
        let model_part = self.done as f64 / self.tokens.max(1) as f64;
        let done = self.finished as f64 + model_part;
        let elapsed = (now - self.run_start?).as_secs_f64();
        (self.models > 0 && done >= 0.1).then(|| elapsed / done * (self.models as f64 - done).max(0.0))
    }

    /// The line to print for `p`, if any.
    pub(crate) fn line(&mut self, p: &Progress<'_>) -> Option<String> {
        match *p {
            Progress::Generating { model, tokens } => {
                (self.model, self.tokens, self.done, self.quarter) = (model.to_string(), tokens, 0, 0);
                let now = std::time::Instant::now();
                (self.start, self.last) = (Some(now), Some(now));
                self.run_start.get_or_insert(now);
                Some(format!("qdrift: {model}: generating {tokens} tokens"))
            }
            Progress::Generated { tokens } => {
                self.done += tokens;
                let quarter = (self.done * 4).checked_div(self.tokens).unwrap_or(0).min(4);
                let now = std::time::Instant::now();
                let due = self.last.is_none_or(|last| now - last >= PLAIN_PROGRESS_EVERY);
                (quarter > self.quarter || (due && self.done < self.tokens)).then(|| {
                    self.quarter = quarter;
                    self.last = Some(now);
                    let secs = self.start.map_or(0.0, |s| (now - s).as_secs_f64());
                    let percent = (self.done * 100).checked_div(self.tokens).unwrap_or(100).min(100);
                    let left = self.tokens.saturating_sub(self.done);
                    let mut eta = if left == 0 || self.done * 10 < self.tokens {
                        String::new()
                    } else {
                        format!(", about {:.0} s left", secs * left as f64 / self.done as f64)
                    };
                    if let Some(all) = self.run_left(now).filter(|_| self.models > 1) {
                        eta.push_str(&format!("; the run: about {} left", minutes(all)));
                    }
                    format!(
                        "qdrift: {}: {percent}% ({}/{} tokens, {secs:.0} s{eta})",
                        self.model, self.done, self.tokens
                    )
                })
            }
            Progress::Scoring { model } => Some(format!("qdrift: {model}: scoring")),
            Progress::Warning { message } => Some(format!("qdrift: warning: {message}")),
            Progress::Done { model } => {
                self.finished += 1;
                (self.tokens, self.done) = (0, 0);
                Some(format!("qdrift: {model}: done"))
            }
        }
    }
}

/// Seconds as a log says a time left: `45 s`, `12 min`, `2.5 h`.
fn minutes(secs: f64) -> String {
    match secs {
        s if s < 90.0 => format!("{s:.0} s"),
        s if s < 5400.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Wall time per phase of a run (`--phase-times`), from the progress events: a phase lasts until
/// the next one starts. A model's generation is its prefill until the first step comes back
/// (with batches side by side, until the first batch's), then decode; scoring (teacher forcing
/// and the reductions of its logits) lasts until the model is done; what follows until the next
/// model generates is quantizing and building it.
pub(crate) struct PhaseClock {
    start: std::time::Instant,
    current: (&'static str, std::time::Instant),
    totals: Vec<(&'static str, f64)>,
    in_prefill: bool,
}

impl PhaseClock {
    pub(crate) fn new() -> Self {
        let now = std::time::Instant::now();
        Self { start: now, current: ("load and plan", now), totals: Vec::new(), in_prefill: false }
    }

    /// Closes the current phase and starts `phase`.
    pub(crate) fn enter(&mut self, phase: &'static str) {
        let now = std::time::Instant::now();
        let (name, since) = std::mem::replace(&mut self.current, (phase, now));
        let secs = now.duration_since(since).as_secs_f64();
        match self.totals.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => *t += secs,
            None => self.totals.push((name, secs)),
        }
    }

    pub(crate) fn observe(&mut self, p: &Progress<'_>) {
        match p {
            Progress::Generating { .. } => {
                self.enter("prefill");
                self.in_prefill = true;
            }
            Progress::Generated { .. } if self.in_prefill => {
                self.enter("decode");
                self.in_prefill = false;
            }
            Progress::Scoring { .. } => self.enter("teacher forcing and reductions"),
            Progress::Done { .. } => self.enter("quantize and build the next variant"),
            _ => {}
        }
    }

    /// The table of phases, in first-seen order, with their share of the whole.
    pub(crate) fn finish(&mut self) -> String {
        self.enter("");
        let total = self.start.elapsed().as_secs_f64();
        let mut out = String::from("phase times:\n");
        for (name, secs) in self.totals.iter().filter(|(n, _)| !n.is_empty()) {
            out.push_str(&format!("  {name:<36} {secs:>8.1} s  {:>5.1}%\n", 100.0 * secs / total.max(1e-9)));
        }
        out.push_str(&format!("  {:<36} {total:>8.1} s\n", "total"));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The run's time left counts every model: one of four models half done after 10 s leaves
    /// about 70 s; no time left is said in a model's first tenth.
    #[test]
    fn the_whole_runs_time_left_counts_every_model() {
        let mut p = PlainProgress::new(4);
        p.line(&Progress::Generating { model: "fp16", tokens: 100 });
        let start = p.run_start.expect("started");
        p.done = 50;
        let left = p.run_left(start + std::time::Duration::from_secs(10)).expect("an estimate");
        assert!((left - 70.0).abs() < 1e-6, "{left}");
        p.done = 5;
        assert_eq!(p.run_left(start + std::time::Duration::from_secs(10)), None);
        p.done = 20;
        let line = p.line(&Progress::Generated { tokens: 5 }).expect("the first quarter's line");
        assert!(line.contains("s left; the run: about"), "{line}");
        assert_eq!(minutes(45.0), "45 s");
        assert_eq!(minutes(720.0), "12 min");
    }
}
