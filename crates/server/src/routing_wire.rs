//! Routing rows on the wire: which rows a request asked for, and their JSON encodings.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use routed_routing::{IdWidth, encode_npy, encode_raw_i32};
use routed_types::{RoutingMeta, RoutingRows};
use serde_json::{Value, json};

use crate::error::ApiError;
use routed_runtime::ModelInfo;

/// How `choices[i].routed_experts` is encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoutingFormat {
    /// Base64 of a `.npy` v1.0 file, `|u1` or `<u2` (the default).
    NpyB64,
    /// Base64 of the flat little-endian int32 array, row-major `[rows, L, K]`.
    RawB64Int32,
    /// Nested JSON arrays `[rows][L][K]`.
    List,
}

impl RoutingFormat {
    /// Parses the `routed_experts_format` field.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "npy_b64" => Some(Self::NpyB64),
            "raw_b64_int32" => Some(Self::RawB64Int32),
            "list" => Some(Self::List),
            _ => None,
        }
    }

    /// The name clients send.
    pub fn name(self) -> &'static str {
        match self {
            Self::NpyB64 => "npy_b64",
            Self::RawB64Int32 => "raw_b64_int32",
            Self::List => "list",
        }
    }
}

/// What a request asked for: routing from row `start`, in `format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingRequest {
    /// Rows before this one are dropped.
    pub start: usize,
    /// The encoding.
    pub format: RoutingFormat,
}

/// The routing fields of a request, before validation.
#[derive(Clone, Debug, Default)]
pub(crate) struct RoutingFields {
    pub return_routed_experts: Option<bool>,
    pub start_len: Option<i64>,
    pub prompt_start: Option<i64>,
    pub format: Option<String>,
}

/// Decides whether routing is returned and checks the offset and format against every prompt.
/// Routing is returned by default when the server captures it; asking for it explicitly on a
/// server that does not is a 400 naming the flag.
pub(crate) fn resolve(
    info: &ModelInfo,
    fields: &RoutingFields,
    prompt_lens: &[usize],
) -> Result<Option<RoutingRequest>, ApiError> {
    let capture = info.routing_capture && info.routing.is_some();
    let wanted = match (fields.return_routed_experts, capture) {
        (Some(false), _) | (None, false) => false,
        (Some(true), false) if info.routing.is_none() => {
            return Err(ApiError::invalid(
                "return_routed_experts",
                "this model has no MoE layers, so there is no routing to return",
            ));
        }
        (Some(true), false) => {
            return Err(ApiError::invalid(
                "return_routed_experts",
                "routing capture is disabled on this server (--disable-return-routed-experts); \
                 start it with --enable-return-routed-experts to request routed experts",
            ));
        }
        (_, true) => true,
    };
    let (param, start) = match (fields.start_len, fields.prompt_start) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid(
                "routed_experts_start_len",
                format!(
                    "routed_experts_start_len ({a}) and its alias routed_experts_prompt_start \
                     ({b}) disagree; give one of them"
                ),
            ));
        }
        (Some(a), _) => ("routed_experts_start_len", a),
        (None, Some(b)) => ("routed_experts_prompt_start", b),
        (None, None) => ("routed_experts_start_len", 0),
    };
    let format = match fields.format.as_deref() {
        None => RoutingFormat::NpyB64,
        Some(name) => RoutingFormat::parse(name).ok_or_else(|| {
            ApiError::invalid(
                "routed_experts_format",
                format!(
                    "unknown routed_experts_format '{name}': use npy_b64, raw_b64_int32 or list"
                ),
            )
        })?,
    };
    if !wanted {
        return Ok(None);
    }
    let shortest = prompt_lens.iter().copied().min().unwrap_or(0);
    let start = usize::try_from(start).ok().filter(|&s| s <= shortest).ok_or_else(|| {
        ApiError::invalid(
            param,
            format!("{param} must be between 0 and the prompt length ({shortest}), got {start}"),
        )
    })?;
    Ok(Some(RoutingRequest { start, format }))
}

/// The dtype name reported in `routed_experts_meta` for `format`.
fn dtype_name(meta: &RoutingMeta, format: RoutingFormat) -> &'static str {
    match format {
        RoutingFormat::RawB64Int32 => "int32",
        RoutingFormat::NpyB64 | RoutingFormat::List => {
            IdWidth::for_num_experts(meta.num_experts).dtype_name()
        }
    }
}

/// The response-level `routed_experts_meta` object.
pub(crate) fn meta_json(meta: &RoutingMeta, request: RoutingRequest) -> Value {
    json!({
        "start": request.start,
        "num_moe_layers": meta.num_moe_layers(),
        "moe_layer_ids": meta.moe_layer_ids,
        "num_experts": meta.num_experts,
        "top_k": meta.top_k,
        "dtype": dtype_name(meta, request.format),
        "format": request.format.name(),
    })
}

/// Encodes one choice's rows; `None` (a choice aborted before any forward) is JSON `null`.
pub(crate) fn encode(
    rows: Option<&RoutingRows>,
    meta: &RoutingMeta,
    format: RoutingFormat,
) -> Result<Value, ApiError> {
    let Some(rows) = rows else { return Ok(Value::Null) };
    check_layout(rows, meta)?;
    let internal = |e: routed_routing::RoutingError| ApiError::Internal(e.to_string());
    Ok(match format {
        RoutingFormat::NpyB64 => {
            Value::String(STANDARD.encode(encode_npy(rows, meta.num_experts).map_err(internal)?))
        }
        RoutingFormat::RawB64Int32 => {
            Value::String(STANDARD.encode(encode_raw_i32(rows).map_err(internal)?))
        }
        RoutingFormat::List => Value::Array(
            (0..rows.num_rows)
                .map(|i| {
                    Value::Array(
                        rows.row(i).chunks(rows.top_k.max(1)).map(|layer| json!(layer)).collect(),
                    )
                })
                .collect(),
        ),
    })
}

/// Base64 of the flat int32 array and its `[rows, L, K]` shape, as `/generate` returns them.
pub(crate) fn encode_sglang(
    rows: &RoutingRows,
    meta: &RoutingMeta,
) -> Result<(String, [usize; 3]), ApiError> {
    check_layout(rows, meta)?;
    let bytes = encode_raw_i32(rows).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok((STANDARD.encode(bytes), rows.shape()))
}

/// The engine's rows must have the model's layer axis; anything else is a bug, not bad input.
fn check_layout(rows: &RoutingRows, meta: &RoutingMeta) -> Result<(), ApiError> {
    let expected_len = rows.num_rows * rows.num_moe_layers * rows.top_k;
    if rows.num_moe_layers != meta.num_moe_layers()
        || rows.top_k != meta.top_k as usize
        || rows.ids.len() != expected_len
    {
        return Err(ApiError::Internal(format!(
            "routing rows have layout [{}, {}, {}] and {} ids; the model has {} MoE layers and \
             top_k {}",
            rows.num_rows,
            rows.num_moe_layers,
            rows.top_k,
            rows.ids.len(),
            meta.num_moe_layers(),
            meta.top_k
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(capture: bool) -> ModelInfo {
        ModelInfo {
            served_model_name: "m".into(),
            max_model_len: 64,
            vocab_size: 100,
            routing: Some(RoutingMeta {
                num_layers: 4,
                moe_layer_ids: vec![1, 3],
                num_experts: 8,
                top_k: 2,
            }),
            routing_capture: capture,
            num_kv_blocks: 8,
            block_size: 16,
            num_snapshot_slots: 0,
            device: "cpu".into(),
            default_seed: 0,
            weight_bytes_per_token: 0,
        }
    }

    fn fields(ret: Option<bool>, a: Option<i64>, b: Option<i64>, f: Option<&str>) -> RoutingFields {
        RoutingFields {
            return_routed_experts: ret,
            start_len: a,
            prompt_start: b,
            format: f.map(str::to_owned),
        }
    }

    fn param(err: ApiError) -> Option<String> {
        match err {
            ApiError::InvalidRequest { param, .. } => param,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn routing_is_on_by_default_and_refused_when_not_captured() {
        let on = info(true);
        let req = resolve(&on, &fields(None, None, None, None), &[5]).unwrap();
        assert_eq!(req, Some(RoutingRequest { start: 0, format: RoutingFormat::NpyB64 }));
        assert_eq!(resolve(&on, &fields(Some(false), None, None, None), &[5]).unwrap(), None);
        let off = info(false);
        assert_eq!(resolve(&off, &fields(None, None, None, None), &[5]).unwrap(), None);
        let err = resolve(&off, &fields(Some(true), None, None, None), &[5]).unwrap_err();
        assert!(err.to_string().contains("--enable-return-routed-experts"));
        assert_eq!(param(err).as_deref(), Some("return_routed_experts"));
    }

    #[test]
    fn start_offsets_and_formats_are_checked() {
        let on = info(true);
        let ok = |f| resolve(&on, &f, &[5, 4]).unwrap().unwrap();
        assert_eq!(ok(fields(None, Some(4), Some(4), None)).start, 4);
        assert_eq!(ok(fields(None, None, Some(2), Some("list"))).format, RoutingFormat::List);
        let bad = |f| param(resolve(&on, &f, &[5, 4]).unwrap_err());
        assert_eq!(
            bad(fields(None, Some(5), None, None)).as_deref(),
            Some("routed_experts_start_len")
        );
        assert_eq!(
            bad(fields(None, None, Some(-1), None)).as_deref(),
            Some("routed_experts_prompt_start")
        );
        assert_eq!(
            bad(fields(None, Some(1), Some(2), None)).as_deref(),
            Some("routed_experts_start_len")
        );
        assert_eq!(
            bad(fields(None, None, None, Some("csv"))).as_deref(),
            Some("routed_experts_format")
        );
    }

    #[test]
    fn encodings_agree() {
        let meta = info(true).routing.unwrap();
        let rows = RoutingRows {
            start: 0,
            num_rows: 2,
            num_moe_layers: 2,
            top_k: 2,
            ids: vec![0, 1, 2, 3, 4, 5, 6, 7],
        };
        let list = encode(Some(&rows), &meta, RoutingFormat::List).unwrap();
        assert_eq!(list, json!([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]));
        let raw = encode(Some(&rows), &meta, RoutingFormat::RawB64Int32).unwrap();
        let bytes = STANDARD.decode(raw.as_str().unwrap()).unwrap();
        assert_eq!(bytes.len(), 32);
        assert_eq!(&bytes[4..8], &1i32.to_le_bytes());
        assert_eq!(encode(None, &meta, RoutingFormat::NpyB64).unwrap(), Value::Null);
        let short = RoutingRows { ids: vec![0; 3], ..rows };
        assert!(matches!(
            encode(Some(&short), &meta, RoutingFormat::List),
            Err(ApiError::Internal(_))
        ));
    }
}
