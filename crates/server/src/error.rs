//! The crate's one error type and its wire shape.
//!
//! Every failure a client can see goes through [`ApiError`]: a status code and the OpenAI body
//! `{"error": {"message", "type", "param", "code"}}`. Bad input is always a 4xx naming the field
//! in `param`; a 500 means a bug in the engine or the gateway, never bad input.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError, error::JsonPayloadError, web};
use routed_runtime::EngineError;
use serde::Serialize;

/// An error answered to an HTTP client.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 400 `invalid_request_error`: malformed JSON, a wrong type, a missing field, an
    /// out-of-range value or a feature this server does not offer.
    #[error("{message}")]
    InvalidRequest {
        /// What is wrong, in words.
        message: String,
        /// The request field at fault, when one is.
        param: Option<String>,
        /// A machine-readable code (`invalid_json`, `invalid_type`, `invalid_value`...).
        code: &'static str,
    },
    /// 404 `not_found_error`: an unknown model or route.
    #[error("{message}")]
    NotFound {
        /// What was not found.
        message: String,
        /// The request field at fault (`model`), if any.
        param: Option<String>,
        /// `model_not_found` or `route_not_found`.
        code: &'static str,
    },
    /// 405 `invalid_request_error`: a known route called with the wrong method.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The method used.
        method: String,
        /// The route.
        path: String,
    },
    /// 408 `invalid_request_error`: the request body did not arrive within the body read
    /// timeout. The connection is closed after the answer.
    #[error("{message}")]
    Timeout {
        /// What did not arrive in time.
        message: String,
    },
    /// 503 `overloaded_error`: the waiting queue is full, or the engine is unhealthy or
    /// shutting down.
    #[error("{message}")]
    Overloaded {
        /// Why the request cannot be served now.
        message: String,
        /// `queue_full`, `unhealthy` or `shutting_down`.
        code: &'static str,
    },
    /// 500 `internal_error`: a bug in the engine or the gateway.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// A 400 about `param` with code `invalid_value`.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: Some(param.to_owned()),
            code: "invalid_value",
        }
    }

    /// A 400 about the required `param`, absent.
    pub fn missing(param: &str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: Some(param.to_owned()),
            code: "missing_required_parameter",
        }
    }

    /// A 400 about `param` for a feature this server does not offer.
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            message: message.into(),
            param: Some(param.to_owned()),
            code: "unsupported_parameter",
        }
    }

    /// The OpenAI `type` string.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::InvalidRequest { .. } | Self::MethodNotAllowed { .. } | Self::Timeout { .. } => {
                "invalid_request_error"
            }
            Self::NotFound { .. } => "not_found_error",
            Self::Overloaded { .. } => "overloaded_error",
            Self::Internal(_) => "internal_error",
        }
    }

    /// The `{"error": {...}}` body.
    pub fn body(&self) -> ErrorBody {
        let (param, code) = match self {
            Self::InvalidRequest { param, code, .. } | Self::NotFound { param, code, .. } => {
                (param.clone(), Some(*code))
            }
            Self::MethodNotAllowed { .. } => (None, Some("method_not_allowed")),
            Self::Timeout { .. } => (None, Some("body_timeout")),
            Self::Overloaded { code, .. } => (None, Some(*code)),
            Self::Internal(_) => (None, Some("internal_error")),
        };
        ErrorBody {
            error: ErrorDetail {
                message: self.to_string(),
                kind: self.kind(),
                param,
                code: code.map(str::to_owned),
            },
        }
    }
}

/// The JSON body of an error response.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// The fields of an error, as OpenAI names them.
#[derive(Clone, Debug, Serialize)]
pub struct ErrorDetail {
    /// What went wrong.
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `overloaded_error` or `internal_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<String>,
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } => StatusCode::BAD_REQUEST,
            Self::NotFound { .. } => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::Timeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::Overloaded { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        if let Self::Internal(message) = self {
            tracing::error!(%message, "internal error answered to a client");
        }
        let mut response = HttpResponse::build(self.status_code());
        // The rest of a late body may still arrive; the connection cannot carry another request.
        if let Self::Timeout { .. } = self {
            response.force_close();
        }
        response.json(self.body())
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> Self {
        match err {
            EngineError::Overloaded(_) => {
                Self::Overloaded { message: err.to_string(), code: "queue_full" }
            }
            EngineError::InvalidRequest { param, message } => Self::InvalidRequest {
                message,
                param: Some(param.to_owned()),
                code: "invalid_value",
            },
            EngineError::ShutDown => Self::Overloaded {
                message: "the server is shutting down".into(),
                code: "shutting_down",
            },
            EngineError::Unhealthy(_) => {
                Self::Overloaded { message: err.to_string(), code: "unhealthy" }
            }
            EngineError::Internal(message)
            | EngineError::Load(message)
            | EngineError::DeviceUnavailable { message, .. } => Self::Internal(message),
            EngineError::Conflict(message) => {
                Self::InvalidRequest { message, param: None, code: "conflict" }
            }
        }
    }
}

/// Turns a `serde_path_to_error` failure into a 400 naming the field it happened at.
pub(crate) fn from_serde(err: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let path = err.path().to_string();
    let inner = err.into_inner();
    let at = (path != ".").then_some(path);
    if let Some(field) = missing_field_name(&inner) {
        let param = match at {
            Some(at) => format!("{at}.{field}"),
            None => field,
        };
        return ApiError::missing(&param, format!("'{param}' is required"));
    }
    let message = match &at {
        Some(p) => format!("invalid value for '{p}': {inner}"),
        None => inner.to_string(),
    };
    ApiError::InvalidRequest { message, param: at, code: "invalid_type" }
}

/// `missing field `prompt`` names the field only in its message.
fn missing_field_name(err: &serde_json::Error) -> Option<String> {
    let text = err.to_string();
    let rest = text.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_owned())
}

/// A [`web::JsonConfig`] for an embedding app's own JSON routes that answers as the gateway's
/// routes do: a body of any content type is parsed as JSON, up to 64 MiB, and malformed JSON is
/// a 400 in the OpenAI shape. (The gateway's own routes read their bodies with a read timeout
/// and parse them off the I/O threads.)
pub fn json_config() -> web::JsonConfig {
    web::JsonConfig::default()
        .limit(crate::body::BODY_LIMIT)
        .content_type_required(false)
        .error_handler(|err, _req| json_error(err).into())
}

pub(crate) fn json_error(err: JsonPayloadError) -> ApiError {
    let (message, code) = match &err {
        JsonPayloadError::Overflow { limit }
        | JsonPayloadError::OverflowKnownLength { limit, .. } => {
            (format!("the request body is larger than {limit} bytes"), "body_too_large")
        }
        JsonPayloadError::Deserialize(e) if e.is_data() => {
            (format!("the request body has a wrong type: {e}"), "invalid_type")
        }
        JsonPayloadError::Deserialize(e) => {
            (format!("the request body is not valid JSON: {e}"), "invalid_json")
        }
        other => (format!("the request body could not be read: {other}"), "invalid_json"),
    };
    ApiError::InvalidRequest { message, param: None, code }
}

/// The fallback service: an unknown route is a 404 in the OpenAI error shape. Mount it with
/// `App::default_service(web::to(routed_server::not_found))`.
pub async fn not_found(req: HttpRequest) -> HttpResponse {
    ApiError::NotFound {
        message: format!("no route for {} {}", req.method(), req.path()),
        param: None,
        code: "route_not_found",
    }
    .error_response()
}

/// A known route called with the wrong method.
pub(crate) async fn method_not_allowed(req: HttpRequest) -> HttpResponse {
    ApiError::MethodNotAllowed { method: req.method().to_string(), path: req.path().to_owned() }
        .error_response()
}
