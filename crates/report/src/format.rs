//! Formatting shared by every rendering (Markdown, HTML, JUnit, terminal, gate lines): numbers,
//! and strings from a report made safe for each markup.
//!
//! Rates and ratios get four decimals; KL divergences below 0.01 nats switch to scientific
//! notation (two significant decimals), so `2.1e-4` is not printed as `0.0002`.
//!
//! A leaf module: it depends on nothing else of this crate, so every other module may use it.

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

/// `x` to `digits` significant digits (1 to 17), in its shortest form: trailing zeros dropped,
/// scientific below 0.01 in magnitude as [`kld`] prints KL divergences (`6.252e-5`) and from a
/// million up. `0.5499999999999999` to 4 digits is `0.55`; 17 digits read back as `x` itself.
pub(crate) fn significant(x: f64, digits: usize) -> String {
    if x == 0.0 || !x.is_finite() {
        return if x == 0.0 { "0".to_string() } else { x.to_string() };
    }
    let digits = digits.clamp(1, 17);
    let a = x.abs();
    if !(0.01..1e6).contains(&a) {
        let s = format!("{:.*e}", digits - 1, x);
        return match s.split_once('e') {
            Some((mantissa, exponent)) => format!("{}e{exponent}", trim_zeros(mantissa)),
            None => s,
        };
    }
    let exponent = a.log10().floor() as i32;
    let decimals = (digits as i32 - 1 - exponent).max(0) as usize;
    trim_zeros(&format!("{x:.decimals$}"))
}

/// A decimal without the zeros after its last significant digit (`0.5500` → `0.55`, `2.000` →
/// `2`); an integer as it is.
fn trim_zeros(s: &str) -> String {
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s.to_string() }
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

/// Escapes text or an attribute value for HTML and XML 1.0 alike (numeric `&#39;` is XML too);
/// control characters other than tab, newline and carriage return, and the noncharacters
/// U+FFFE/U+FFFF (which XML 1.0 cannot hold) become U+FFFD.
pub(crate) fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if c.is_control() || c == '\u{FFFE}' || c == '\u{FFFF}' => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// Escapes a string from the report for Markdown text (CommonMark: any ASCII punctuation may be
/// backslash-escaped); control characters become spaces so a name cannot break a table row.
pub(crate) fn escape_markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' | '`' | '*' | '_' | '[' | ']' | '<' | '>' | '|' | '#' | '~' | '&' | '!' | '$' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// The last component of a path as written in a report (`/` or `\` separated; trailing
/// separators ignored). Reports name files without the folders of the machine that wrote them,
/// but older reports may hold a whole path: renderings show only its file name.
pub(crate) fn file_name(path: &str) -> &str {
    let trimmed = path.trim_end_matches(['/', '\\']);
    trimmed.rsplit(['/', '\\']).next().filter(|n| !n.is_empty()).unwrap_or(path)
}

/// The first 12 hex digits of a SHA-256: enough to tell files apart in a sentence.
pub(crate) fn short_sha256(sha256: &str) -> String {
    sha256.chars().take(12).collect()
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
    }

    #[test]
    fn significant_digits_in_the_shortest_form() {
        assert_eq!(significant(0.5499999999999999, 4), "0.55");
        assert_eq!(significant(0.00006252050617274569, 4), "6.252e-5");
        assert_eq!(significant(0.0031, 4), "3.1e-3");
        assert_eq!(significant(0.0123456, 4), "0.01235");
        assert_eq!(significant(-1.0375, 4), "-1.038");
        assert_eq!(significant(2.0, 4), "2");
        assert_eq!(significant(9.99996, 4), "10");
        assert_eq!(significant(123456.7, 4), "123457");
        assert_eq!(significant(1.5e7, 4), "1.5e7");
        assert_eq!(significant(0.0, 4), "0");
        assert_eq!(significant(f64::NAN, 4), "NaN");
        for x in [0.1 + 0.2, 1.0 / 3.0, 6.252050617274569e-5, 0.8521874999999999] {
            assert_eq!(significant(x, 17).parse::<f64>().unwrap(), x, "{x}");
        }
    }

    #[test]
    fn strings_are_escaped_for_their_markup() {
        assert_eq!(escape_html("a<&>\"'\u{7}"), "a&lt;&amp;&gt;&quot;&#39;\u{FFFD}");
        assert_eq!(escape_markdown("a|b_*\n"), "a\\|b\\_\\* ");
    }

    #[test]
    fn only_the_file_name_of_a_path_is_shown() {
        assert_eq!(file_name("/work/main/xtask/../../shared/models/stories260K/stories260K.bin"), "stories260K.bin");
        assert_eq!(file_name("C:\\models\\a.gguf"), "a.gguf");
        assert_eq!(file_name("models/SmolLM2-135M-Instruct/"), "SmolLM2-135M-Instruct");
        assert_eq!(file_name("synthetic:tiny"), "synthetic:tiny");
        assert_eq!(file_name("eval-sets/stories.jsonl (built in)"), "stories.jsonl (built in)");
        assert_eq!(file_name(""), "");
        assert_eq!(short_sha256("b0a507e7ad0f626624f17112"), "b0a507e7ad0f");
    }
}
