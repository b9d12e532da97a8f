//! Request bodies, and the work a request needs before it reaches the engine.
//!
//! A body is read on the I/O thread (reading only waits, it never computes) with a size limit and
//! a deadline: a client that sends its headers and then stalls mid-body is answered 408 and
//! disconnected once the body read timeout passes, as a stalled header is. Everything that
//! computes on a body (JSON parsing, chat templating, tokenizing: seconds for tens of MiB) runs on
//! the blocking pool through [`prepare`], so one large body never holds up the other requests of
//! its I/O thread, streams included. After a large body the freed memory is given back to the
//! operating system: the allocator would otherwise keep the gigabytes tokenizing it took.

use std::time::Duration;

use actix_web::dev::Payload;
use actix_web::error::{JsonPayloadError, PayloadError};
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::{FromRequest, HttpRequest};
use futures_util::StreamExt;
use futures_util::future::LocalBoxFuture;
use serde_json::Value;

use crate::AppState;
use crate::error::{ApiError, json_error};

/// The largest body accepted.
pub(crate) const BODY_LIMIT: usize = 64 << 20;

/// Default of [`crate::ServerConfig::body_read_timeout`]: as long as actix-web gives a request's
/// headers.
pub(crate) const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// After preparing a body at least this large, freed memory is given back to the OS.
const GIVE_BACK_AFTER: usize = 1 << 20;

/// A whole request body, read within the limit and the deadline, not parsed yet.
pub(crate) struct JsonBody {
    bytes: Bytes,
}

impl JsonBody {
    /// Parses the body as JSON, whatever its `Content-Type` (as the OpenAI clients send it).
    fn parse(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.bytes)
            .map_err(|e| json_error(JsonPayloadError::Deserialize(e)))
    }

    /// Parses the body, an empty one as `{}` (the control routes' bodies are optional).
    pub(crate) fn value_or_empty(&self) -> Result<Value, ApiError> {
        if self.bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Object(Default::default()));
        }
        self.parse()
    }
}

impl FromRequest for JsonBody {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let timeout = req
            .app_data::<web::Data<AppState>>()
            .map_or(DEFAULT_BODY_READ_TIMEOUT, |s| s.body_read_timeout());
        let declared = req
            .headers()
            .get(actix_web::http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
        let payload = payload.take();
        Box::pin(read(payload, declared, timeout))
    }
}

/// Reads a body of at most [`BODY_LIMIT`] bytes, all of it within `timeout`.
async fn read(
    mut payload: Payload,
    declared: Option<usize>,
    timeout: Duration,
) -> Result<JsonBody, ApiError> {
    let too_large = || json_error(JsonPayloadError::Overflow { limit: BODY_LIMIT });
    if declared.is_some_and(|n| n > BODY_LIMIT) {
        return Err(too_large());
    }
    let deadline = tokio::time::Instant::now() + timeout;
    // Reserve no more than a MiB up front: a client that declares 64 MiB and stalls must not
    // hold 64 MiB per connection.
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0).min(1 << 20));
    loop {
        let chunk = match tokio::time::timeout_at(deadline, payload.next()).await {
            Ok(None) => break,
            Ok(Some(chunk)) => chunk,
            Err(_) => {
                return Err(ApiError::Timeout {
                    message: format!(
                        "the request body did not arrive within {} s ({} bytes received)",
                        timeout.as_secs_f64(),
                        body.len()
                    ),
                });
            }
        };
        let chunk = chunk.map_err(|e: PayloadError| json_error(JsonPayloadError::Payload(e)))?;
        if body.len() + chunk.len() > BODY_LIMIT {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(JsonBody { bytes: body.freeze() })
}

/// Parses `body` and runs `work` on it on the blocking pool, counted as preparing in the
/// registry (a shutdown waits for it). After a large body, freed memory goes back to the OS.
pub(crate) async fn prepare<T: Send + 'static>(
    state: &web::Data<AppState>,
    body: JsonBody,
    work: impl FnOnce(&AppState, &Value) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let _preparing = state.registry().preparing();
    let state = state.clone();
    web::block(move || {
        let large = body.bytes.len() >= GIVE_BACK_AFTER;
        let result = body.parse().and_then(|value| work(&state, &value));
        drop(body);
        if large {
            give_back_memory();
        }
        result
    })
    .await
    .map_err(|e| ApiError::Internal(format!("the blocking pool failed: {e}")))?
}

/// Returns freed heap memory to the operating system. glibc keeps freed memory in its arenas for
/// reuse (and a thread's arena stays with it), so after a body that took gigabytes to tokenize
/// the process would keep them resident for good; `malloc_trim` releases every arena's free
/// pages. Costs a few milliseconds, so it runs only after large bodies, on the blocking pool.
fn give_back_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists; any thread may call it.
    unsafe {
        libc::malloc_trim(0);
    }
}
