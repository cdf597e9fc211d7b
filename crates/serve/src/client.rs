//! The HTTP side: one [`Server`] per endpoint, JSON in and out, retries on what retrying can
//! fix (no connection, a timeout, HTTP 429 and 5xx), and the model the requests name.

use std::time::Duration;

use serde_json::Value;

use crate::endpoint::{Endpoint, TOKEN_ENV};
use crate::error::ServeError;

/// The largest answer read (a 1000-token completion with 20 log-probabilities per token is a few
/// MiB of JSON); a larger one is refused, not buffered.
const MAX_ANSWER_BYTES: u64 = 256 << 20;

/// How requests are made.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerOptions {
    /// Requests in flight at once ([`crate::run_bounded`]).
    pub concurrency: usize,
    /// The limit on one request, connection to last byte.
    pub timeout: Duration,
    /// Attempts after the first, for a failure that retrying can fix.
    pub retries: u32,
    /// The first retry's wait; each further one waits twice as long.
    pub backoff: Duration,
    /// The bearer token; [`ServerOptions::from_env`] reads it from [`TOKEN_ENV`].
    pub token: Option<String>,
}

impl ServerOptions {
    /// `concurrency` requests at once, a 600 s timeout per request (a 1000-token completion on a
    /// busy server), 3 retries from half a second, and the token from [`TOKEN_ENV`] when it is set.
    pub fn from_env(concurrency: usize) -> ServerOptions {
        ServerOptions {
            concurrency: concurrency.max(1),
            timeout: Duration::from_secs(600),
            retries: 3,
            backoff: Duration::from_millis(500),
            token: std::env::var(TOKEN_ENV).ok().filter(|t| !t.trim().is_empty()),
        }
    }
}

/// A connection to one server and the model its requests name.
#[derive(Debug, Clone)]
pub struct Server {
    endpoint: Endpoint,
    model: String,
    models: Value,
    agent: ureq::Agent,
    options: ServerOptions,
}

/// One attempt's failure: whether another attempt may succeed.
enum Attempt {
    Retry(ServeError),
    Fail(ServeError),
}

impl Server {
    /// Connects: asks `/models` what the server serves, and settles the model the requests name
    /// (the URL's `#MODEL`, which must be served, or the only one).
    ///
    /// # Errors
    /// [`ServeError::Unreachable`], [`ServeError::Status`], [`ServeError::Unusable`] (not an
    /// OpenAI model list), [`ServeError::NoSuchModel`], [`ServeError::WhichModel`].
    pub fn connect(endpoint: Endpoint, options: ServerOptions) -> Result<Server, ServeError> {
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(options.timeout))
            .http_status_as_error(false)
            .user_agent(concat!("qdrift/", env!("CARGO_PKG_VERSION")))
            .build();
        let agent: ureq::Agent = config.into();
        let mut server = Server { endpoint, model: String::new(), models: Value::Null, agent, options };
        let url = format!("{}/models", server.endpoint.base);
        let models = server.get_json(&url)?;
        let ids: Vec<String> = models["data"]
            .as_array()
            .ok_or_else(|| ServeError::Unusable { url: url.clone(), problem: "no `data` list of models".into() })?
            .iter()
            .filter_map(|m| m["id"].as_str().map(str::to_owned))
            .collect();
        let available = if ids.is_empty() { "none".to_owned() } else { ids.join(", ") };
        server.model = match &server.endpoint.model {
            Some(wanted) if ids.iter().any(|id| id == wanted) => wanted.clone(),
            Some(wanted) => {
                return Err(ServeError::NoSuchModel {
                    url: server.endpoint.base.clone(),
                    wanted: wanted.clone(),
                    available,
                });
            }
            None if ids.len() == 1 => ids[0].clone(),
            None => {
                return Err(ServeError::WhichModel { url: server.endpoint.base.clone(), count: ids.len(), available });
            }
        };
        server.models = models;
        Ok(server)
    }

    /// The endpoint connected to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The model every request names.
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The `/models` answer, as the server gave it.
    pub fn models(&self) -> &Value {
        &self.models
    }

    /// The options requests run with.
    pub fn options(&self) -> &ServerOptions {
        &self.options
    }

    /// `GET url`, with retries.
    ///
    /// # Errors
    /// As [`Server::connect`] lists, for this URL.
    pub fn get_json(&self, url: &str) -> Result<Value, ServeError> {
        self.with_retries(url, self.options.retries, || self.agent.get(url).header("Accept", "application/json").call())
    }

    /// `GET url` once, `None` on any failure: for the optional endpoints that only some servers
    /// have (`/version`, `/props`).
    pub fn get_optional(&self, url: &str) -> Option<Value> {
        self.with_retries(url, 0, || self.agent.get(url).call()).ok()
    }

    /// `POST url` with a JSON body, with retries.
    ///
    /// # Errors
    /// As [`Server::connect`] lists, for this URL.
    pub fn post_json(&self, url: &str, body: &Value) -> Result<Value, ServeError> {
        let text = body.to_string();
        self.with_retries(url, self.options.retries, || {
            let mut request = self.agent.post(url).header("Content-Type", "application/json");
            if let Some(token) = &self.options.token {
                request = request.header("Authorization", &format!("Bearer {token}"));
            }
            request.send(text.as_str())
        })
    }

    fn with_retries(
        &self,
        url: &str,
        retries: u32,
        send: impl Fn() -> Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, ServeError> {
        let mut wait = self.options.backoff;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self.attempt(url, attempt, &send) {
                Ok(value) => return Ok(value),
                Err(Attempt::Retry(_)) if attempt <= retries => {
                    std::thread::sleep(wait);
                    wait *= 2;
                }
                Err(Attempt::Retry(e) | Attempt::Fail(e)) => return Err(e),
            }
        }
    }

    fn attempt(
        &self,
        url: &str,
        attempts: u32,
        send: &impl Fn() -> Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, Attempt> {
        let unreachable =
            |message: String| Attempt::Retry(ServeError::Unreachable { url: url.to_owned(), attempts, message });
        let mut response = match send() {
            Ok(response) => response,
            Err(e @ (ureq::Error::BadUri(_) | ureq::Error::Http(_))) => {
                return Err(Attempt::Fail(ServeError::BadUrl { url: url.to_owned(), problem: e.to_string() }));
            }
            Err(e) => return Err(unreachable(e.to_string())),
        };
        let status = response.status().as_u16();
        let body = response.body_mut().with_config().limit(MAX_ANSWER_BYTES).read_to_string();
        let body = match body {
            Ok(body) => body,
            Err(ureq::Error::BodyExceedsLimit(limit)) => {
                return Err(Attempt::Fail(ServeError::Unusable {
                    url: url.to_owned(),
                    problem: format!("the answer is larger than {limit} bytes"),
                }));
            }
            Err(e) => return Err(unreachable(format!("the answer broke off: {e}"))),
        };
        if !(200..300).contains(&status) {
            let error = ServeError::Status { url: url.to_owned(), status, message: error_message(&body) };
            return Err(if status == 429 || status >= 500 { Attempt::Retry(error) } else { Attempt::Fail(error) });
        }
        serde_json::from_str(&body).map_err(|e| {
            Attempt::Fail(ServeError::Unusable {
                url: url.to_owned(),
                problem: format!("not JSON ({e}): {}", excerpt(&body)),
            })
        })
    }
}

/// The server's own words for an error: OpenAI's `{"error": {"message": …}}`, vLLM's and
/// FastAPI's `{"detail": …}` or `{"message": …}`, else the start of the body.
fn error_message(body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let text = parsed.as_ref().and_then(|v| {
        v["error"]["message"]
            .as_str()
            .or_else(|| v["error"].as_str())
            .or_else(|| v["message"].as_str())
            .or_else(|| v["detail"].as_str())
            .map(str::to_owned)
            .or_else(|| v.get("detail").map(Value::to_string))
    });
    excerpt(&text.unwrap_or_else(|| body.to_owned()))
}

/// At most 200 characters of `text` on one line, for an error message.
pub(crate) fn excerpt(text: &str) -> String {
    let line: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).take(200).collect();
    if text.chars().count() > 200 { format!("{line}…") } else { line }
}
