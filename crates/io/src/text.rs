//! A user's string as it may appear in a message: short, and on one line.

use std::borrow::Cow;

/// Characters [`elide`] keeps at each end of a long string.
pub const ELIDE_KEEP: usize = 40;

/// `s` as an error message may quote it: whole when it is short (at most `2 × ELIDE_KEEP + 20`
/// characters), else its first and last [`ELIDE_KEEP`] characters with `…(N bytes)…` between
/// them, `N` the length of `s` in bytes; control characters (a newline, a tab) are written as
/// escapes (`\n`), so that the message stays one line.
///
/// ```
/// assert_eq!(qdrift_io::elide("int8,fp8"), "int8,fp8");
/// let long = "a".repeat(60) + &"b".repeat(60);
/// assert_eq!(qdrift_io::elide(&long), format!("{}…(120 bytes)…{}", "a".repeat(40), "b".repeat(40)));
/// ```
pub fn elide(s: &str) -> Cow<'_, str> {
    let n = s.chars().count();
    let clean = !s.chars().any(char::is_control);
    if n <= 2 * ELIDE_KEEP + 20 {
        return if clean { Cow::Borrowed(s) } else { Cow::Owned(escape(s.chars())) };
    }
    let head = escape(s.chars().take(ELIDE_KEEP));
    let tail = escape(s.chars().skip(n - ELIDE_KEEP));
    Cow::Owned(format!("{head}…({} bytes)…{tail}", s.len()))
}

/// The characters with control characters escaped.
fn escape(chars: impl Iterator<Item = char>) -> String {
    chars.fold(String::new(), |mut out, c| {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_stay_whole_and_long_ones_keep_both_ends() {
        assert!(matches!(elide("int8,fp8-e4m3"), Cow::Borrowed("int8,fp8-e4m3")));
        let exactly = "x".repeat(100);
        assert_eq!(elide(&exactly), exactly);
        let long = format!("{}{}{}", "<".repeat(40), "é".repeat(100_000), ">".repeat(40));
        let e = elide(&long);
        assert_eq!(e, format!("{}…({} bytes)…{}", "<".repeat(40), long.len(), ">".repeat(40)));
        assert!(e.len() < 200);
    }

    #[test]
    fn control_characters_are_escaped() {
        assert_eq!(elide("a\nb\tc"), "a\\nb\\tc");
        let long = "\n".repeat(300);
        let e = elide(&long);
        assert!(!e.contains('\n'), "{e}");
        assert!(e.contains("…(300 bytes)…"), "{e}");
    }
}
