//! Where a served model is: `http(s)://HOST:PORT/v1`, optionally `#MODEL`.

use std::fmt;
use std::str::FromStr;

use crate::error::ServeError;

/// The environment variable holding the bearer token a server wants (`Authorization: Bearer …`).
/// Never a flag: a flag's value lands in shell history, process lists and CI logs.
pub const TOKEN_ENV: &str = "QDRIFT_SERVER_TOKEN";

/// A server's OpenAI-compatible API root and, optionally, the model to ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The API root without a trailing slash (`http://127.0.0.1:8000/v1`): `/completions` and
    /// `/models` are appended to it.
    pub base: String,
    /// The model named after `#`; `None`: the server's only model.
    pub model: Option<String>,
}

impl Endpoint {
    /// Whether `text` is meant as a server (it starts with `http://` or `https://`), so that a
    /// CLI can tell a URL from a file path before parsing either.
    pub fn is_url(text: &str) -> bool {
        let lower = text.get(..8).unwrap_or(text).to_ascii_lowercase();
        lower.starts_with("http://") || lower.starts_with("https://")
    }

    /// `scheme://host:port`, where servers put their non-OpenAI endpoints (`/version`, `/props`).
    pub fn root(&self) -> &str {
        let after_scheme = self.base.find("://").map_or(0, |i| i + 3);
        match self.base[after_scheme..].find('/') {
            Some(slash) => &self.base[..after_scheme + slash],
            None => &self.base,
        }
    }
}

impl FromStr for Endpoint {
    type Err = ServeError;

    /// Parses `http(s)://HOST[:PORT][/PATH][#MODEL]`. Credentials in the URL are refused: a
    /// token belongs in [`TOKEN_ENV`], where it stays out of shell history and reports.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |problem: &str| ServeError::BadUrl { url: text.to_owned(), problem: problem.to_owned() };
        if !Endpoint::is_url(text) {
            return Err(bad("it must start with http:// or https://"));
        }
        let (url, model) = match text.split_once('#') {
            Some((url, model)) if model.trim().is_empty() => {
                return Err(bad(&format!("nothing after '#' in {url}#; write URL#MODEL or leave the '#' out")));
            }
            Some((url, model)) => (url, Some(model.to_owned())),
            None => (text, None),
        };
        let after_scheme = url.find("://").map_or(0, |i| i + 3);
        let authority = url[after_scheme..].split('/').next().unwrap_or("");
        let base = url.trim_end_matches('/');
        if authority.is_empty() {
            return Err(bad("no host"));
        }
        if authority.contains('@') {
            return Err(bad(&format!(
                "credentials in the URL are refused (they would land in reports); put the token in {}",
                TOKEN_ENV
            )));
        }
        if base.contains(char::is_whitespace) || base.contains('?') {
            return Err(bad("spaces or a query string in the URL"));
        }
        Ok(Endpoint { base: base.to_owned(), model })
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.model {
            Some(model) => write!(f, "{}#{model}", self.base),
            None => f.write_str(&self.base),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_with_and_without_a_model() {
        let e: Endpoint = "http://127.0.0.1:8080/v1/#qwen3".parse().unwrap();
        assert_eq!(e.base, "http://127.0.0.1:8080/v1");
        assert_eq!(e.model.as_deref(), Some("qwen3"));
        assert_eq!(e.root(), "http://127.0.0.1:8080");
        assert_eq!(e.to_string(), "http://127.0.0.1:8080/v1#qwen3");
        let e: Endpoint = "HTTPS://gpu.example:443/v1".parse().unwrap();
        assert_eq!(e.model, None);
        assert_eq!(e.root(), "HTTPS://gpu.example:443");
        assert!(Endpoint::is_url("https://x") && !Endpoint::is_url("./model.gguf") && !Endpoint::is_url("ht"));
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for (url, why) in [
            ("ftp://host/v1", "http://"),
            ("http://", "no host"),
            ("http://user:secret@host/v1", "QDRIFT_SERVER_TOKEN"),
            ("http://host/v1#", "nothing after"),
            ("http://host/v1?key=1", "query"),
        ] {
            let err = url.parse::<Endpoint>().unwrap_err().to_string();
            assert!(err.contains(why), "{url}: {err}");
        }
    }
}
