//! Regular expressions from requests (`regex`, a JSON schema's `pattern`, `stop_regex`),
//! compiled once for the recent patterns: an RL rollout sends one pattern with many requests,
//! and compiling one can take milliseconds (a counted Unicode class determinizes into thousands
//! of states). The cache is bounded by count and by its DFAs' bytes (a DFA may take up to
//! 8 MiB).

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use routed_types::{Regex, RegexError, StopRegex};
use serde_json::Value;

use crate::error::ApiError;
use crate::wire::StopField;

/// Patterns whose compiled form is kept, at most.
const NUM_KEPT: usize = 32;

/// The most bytes the kept DFAs take together (the latest is kept whatever its size).
const MAX_KEPT_BYTES: usize = 32 << 20;

/// Recently compiled patterns, the most recent last.
static RECENT: Mutex<VecDeque<Arc<Regex>>> = Mutex::new(VecDeque::new());

/// `pattern` compiled, or the kept one if it was compiled lately.
pub(crate) fn compiled(pattern: &str) -> Result<Arc<Regex>, RegexError> {
    // A poisoned cache is still a valid cache: every entry in it was whole when it went in.
    let recent = || RECENT.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(kept) = recent().iter().rev().find(|r| r.as_str() == pattern) {
        return Ok(Arc::clone(kept));
    }
    // Compiled outside the lock, so that one slow pattern holds up no other request.
    let regex = Arc::new(Regex::new(pattern)?);
    let mut kept = recent();
    kept.push_back(Arc::clone(&regex));
    let mut num_bytes: usize = kept.iter().map(|r| r.heap_bytes()).sum();
    while kept.len() > 1 && (kept.len() > NUM_KEPT || num_bytes > MAX_KEPT_BYTES) {
        num_bytes -= kept.pop_front().map_or(0, |r| r.heap_bytes());
    }
    Ok(regex)
}

/// The `regex` a request's field `param` gives: a string the engine can follow, else a 400
/// naming the field with the reason.
pub(crate) fn regex_of(value: &Value, param: &str) -> Result<Arc<Regex>, ApiError> {
    let Some(pattern) = value.as_str() else {
        return Err(ApiError::InvalidRequest {
            message: format!("{param} must be a regular expression (a string), got {value}"),
            param: Some(param.to_owned()),
            code: "invalid_type",
        });
    };
    compiled(pattern).map_err(|e| ApiError::invalid(param, format!("{param}: {e}")))
}

/// SGLang's `stop_regex` (one pattern or a list) as stop patterns, each compiled once while it is
/// recent; a pattern the engine cannot stop on is a 400 naming the field with the reason.
pub(crate) fn stop_regexes(
    patterns: StopField,
    param: &str,
) -> Result<Vec<Arc<StopRegex>>, ApiError> {
    let refuse = |pattern: &str, e: RegexError| {
        ApiError::invalid(param, format!("{param}: '{pattern}' cannot stop a request: {e}"))
    };
    patterns
        .into_vec()
        .iter()
        .map(|pattern| {
            let anchored = compiled(pattern).map_err(|e| refuse(pattern, e))?;
            StopRegex::new(anchored).map(Arc::new).map_err(|e| refuse(pattern, e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_is_compiled_once_while_it_is_recent() {
        let a = compiled("[0-9]+ apples?").unwrap();
        let b = compiled("[0-9]+ apples?").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.matches(b"12 apples"));
    }

    #[test]
    fn a_bad_pattern_is_a_400_naming_the_field() {
        let e = regex_of(&Value::from("(a"), "guided_regex").unwrap_err().to_string();
        assert!(e.contains("guided_regex") && e.contains("unclosed group"), "{e}");
        let e = regex_of(&Value::from(3), "sampling_params.regex").unwrap_err();
        assert!(matches!(e, ApiError::InvalidRequest { code: "invalid_type", .. }), "{e:?}");
    }
}
