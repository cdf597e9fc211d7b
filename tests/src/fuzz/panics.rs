//! Catching a reader's panic with its location: a hook records the message and location (the
//! payload alone lacks the location), and [`panic_message`] hands it to whoever caught it. A
//! leaf module, used by the workspace and the runner.

use std::sync::Mutex;

/// The last panic's message and location, recorded by the hook (the payload lacks the location).
static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Silences the default panic output (thousands of expected lines) and records each panic.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info.location().map_or_else(String::new, |l| format!("{}:{}", l.file(), l.line()));
        let message = payload_text(info.payload());
        if let Ok(mut last) = LAST_PANIC.lock() {
            *last = Some(format!("panicked at {location}: {message}"));
        }
    }));
}

fn payload_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}

/// The message of the panic just caught: the hook's record with its location when installed.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    LAST_PANIC.lock().ok().and_then(|mut l| l.take()).unwrap_or_else(|| format!("panicked: {}", payload_text(payload)))
}
