use thiserror::Error;

/// Everything that can go wrong talking to a server. Each names the URL it was talking to.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ServeError {
    /// The text given as a server is not an `http(s)://` URL qdrift can use.
    #[error("{url}: not a server URL: {problem}")]
    BadUrl { url: String, problem: String },
    /// No connection, or no answer in time, after every retry.
    #[error("{url}: cannot reach the server after {attempts} attempts ({message}); is it running and listening there?")]
    Unreachable { url: String, attempts: u32, message: String },
    /// An HTTP error status (after retries, for 5xx and 429).
    #[error("{url}: the server answered HTTP {status}: {message}")]
    Status { url: String, status: u16, message: String },
    /// `URL#MODEL` names a model the server does not serve.
    #[error("{url}: the server serves no model named {wanted} (it serves: {available})")]
    NoSuchModel { url: String, wanted: String, available: String },
    /// The server serves several models and the URL names none.
    #[error("{url}: the server serves {count} models ({available}); name one as {url}#MODEL")]
    WhichModel { url: String, count: usize, available: String },
    /// The answer is not what the API promises (not JSON, a missing field, a bad value).
    #[error("{url}: unusable answer: {problem}")]
    Unusable { url: String, problem: String },
    /// The server stopped before the number of tokens asked for.
    #[error(
        "{url}: the server returned {got} tokens where {want} were asked for (finish_reason {reason}); \
         qdrift compares fixed horizons, so the server must not stop at end-of-sequence: vLLM and \
         llama-server honour the request's ignore_eos, other servers need their own setting"
    )]
    Truncated { url: String, got: usize, want: usize, reason: String },
}
