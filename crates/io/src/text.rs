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
    let clean = !s.chars().any(hidden);
    if n <= 2 * ELIDE_KEEP + 20 {
        return if clean { Cow::Borrowed(s) } else { Cow::Owned(escape(s.chars())) };
    }
    let head = escape(s.chars().take(ELIDE_KEEP));
    let tail = escape(s.chars().skip(n - ELIDE_KEEP));
    Cow::Owned(format!("{head}…({} bytes)…{tail}", s.len()))
}

/// The most characters [`message_line`] keeps of a message.
pub const MESSAGE_MAX: usize = 2000;

/// A whole message as the CLI prints it: one line (control characters escaped, and so are the
/// invisible characters that reorder or hide text on a terminal: bidirectional overrides such as
/// U+202E, zero-width ones), at most [`MESSAGE_MAX`] characters (the middle of a longer one
/// elided), whatever a hostile input put in it.
///
/// ```
/// assert_eq!(qdrift_io::message_line("variant a\u{202e}b: bad"), "variant a\\u{202e}b: bad");
/// assert!(qdrift_io::message_line(&"x".repeat(100_000)).chars().count() <= qdrift_io::MESSAGE_MAX + 40);
/// ```
pub fn message_line(s: &str) -> Cow<'_, str> {
    let n = s.chars().count();
    if n <= MESSAGE_MAX && !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    if n <= MESSAGE_MAX {
        return Cow::Owned(escape(s.chars()));
    }
    let keep = MESSAGE_MAX / 2;
    let head = escape(s.chars().take(keep));
    let tail = escape(s.chars().skip(n - keep));
    Cow::Owned(format!("{head}…({} bytes left out)…{tail}", s.len()))
}

/// Whether `c` would break a one-line message or change how the text around it shows: a control
/// character, a bidirectional embedding, override or isolate, a zero-width character.
fn hidden(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' | '\u{feff}')
}

/// The characters with [`hidden`] ones escaped.
fn escape(chars: impl Iterator<Item = char>) -> String {
    chars.fold(String::new(), |mut out, c| {
        if hidden(c) {
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
    fn messages_stay_one_bounded_line() {
        assert!(matches!(message_line("plain"), Cow::Borrowed("plain")));
        assert_eq!(message_line("a\u{1b}[31mred"), "a\\u{1b}[31mred");
        assert_eq!(message_line("x\u{202e}y"), "x\\u{202e}y");
        let huge = format!("start{}end\n", "é".repeat(1 << 20));
        let line = message_line(&huge);
        assert!(line.starts_with("start") && line.ends_with("end\\n"), "{}", &line[..20]);
        assert!(line.chars().count() < MESSAGE_MAX + 40);
        assert!(!line.contains('\n'));
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
