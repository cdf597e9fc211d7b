//! Number formatting shared by every rendering (Markdown, HTML, terminal, gate lines).
//!
//! Rates and ratios get four decimals; KL divergences below 0.01 nats switch to scientific
//! notation (two significant decimals), so `2.1e-4` is not printed as `0.0002`.

use crate::MeanCi;

/// Removes a minus sign from a number that rounded to zero (`-0.0000` → `0.0000`).
fn unsign_zero(s: String) -> String {
    match s.strip_prefix('-') {
        Some(rest) if rest.split('e').next().is_some_and(|m| m.chars().all(|c| c == '0' || c == '.')) => {
            rest.to_string()
        }
        _ => s,
    }
}

/// A rate, share or ratio: four decimals.
pub(crate) fn rate(x: f64) -> String {
    unsign_zero(format!("{x:.4}"))
}

/// A signed difference of rates: `+0.0123`.
pub(crate) fn signed_rate(x: f64) -> String {
    let s = rate(x);
    if s.starts_with('-') || !x.is_finite() { s } else { format!("+{s}") }
}

/// A KL divergence in nats: scientific below 0.01, four decimals above.
pub(crate) fn kld(x: f64) -> String {
    if x != 0.0 && x.abs() < 0.01 { unsign_zero(format!("{x:.2e}")) } else { rate(x) }
}

/// A signed KL divergence difference.
pub(crate) fn signed_kld(x: f64) -> String {
    let s = kld(x);
    if s.starts_with('-') || !x.is_finite() { s } else { format!("+{s}") }
}

/// `mean [lo, hi]` with `f` for each number.
pub(crate) fn with_ci(m: &MeanCi, f: fn(f64) -> String) -> String {
    format!("{} [{}, {}]", f(m.mean), f(m.ci95[0]), f(m.ci95[1]))
}

/// A count with an SI suffix: `134.5M`.
pub(crate) fn count(n: u64) -> String {
    let x = n as f64;
    if n >= 1_000_000_000 {
        format!("{:.2}B", x / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.1}M", x / 1e6)
    } else if n >= 10_000 {
        format!("{:.1}K", x / 1e3)
    } else {
        n.to_string()
    }
}

/// Bytes in binary units: `256.6 MiB`.
pub(crate) fn bytes(n: u64) -> String {
    let x = n as f64;
    if n >= 1 << 30 {
        format!("{:.2} GiB", x / f64::from(1u32 << 30))
    } else if n >= 1 << 20 {
        format!("{:.1} MiB", x / f64::from(1u32 << 20))
    } else if n >= 1 << 10 {
        format!("{:.1} KiB", x / 1024.0)
    } else {
        format!("{n} B")
    }
}

/// A string from a report made safe for a terminal or a one-line message: control characters
/// (escape sequences, newlines) are shown escaped instead of being interpreted.
pub(crate) fn plain(s: &str) -> String {
    s.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_well() {
        assert_eq!(rate(0.91234), "0.9123");
        assert_eq!(rate(-0.00001), "0.0000");
        assert_eq!(signed_rate(0.0123), "+0.0123");
        assert_eq!(signed_rate(-0.0123), "-0.0123");
        assert_eq!(kld(2.1e-4), "2.10e-4");
        assert_eq!(kld(0.0), "0.0000");
        assert_eq!(kld(0.0412), "0.0412");
        assert_eq!(signed_kld(-3.0e-3), "-3.00e-3");
        assert_eq!(count(134_515_008), "134.5M");
        assert_eq!(bytes(269_030_016), "256.6 MiB");
        assert_eq!(plain("a\u{1b}[31mb\n"), "a\\u{1b}[31mb\\n");
        let m = MeanCi { mean: 0.5, ci95: [0.25, 0.75] };
        assert_eq!(with_ci(&m, rate), "0.5000 [0.2500, 0.7500]");
    }
}
