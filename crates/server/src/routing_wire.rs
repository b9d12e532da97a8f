//! Routing rows on the wire: which rows a request asked for, their layer axis, and their JSON
//! encodings.
//!
//! The engine stores MoE layers only (`[rows, num_moe_layers, K]`). Responses default to the
//! decoder-layer layout vLLM and SGLang return (`[rows, num_layers, K]`, indexed by layer id),
//! which RL trainers reshape with `num_hidden_layers`; the expansion happens here, when a response
//! is encoded.

use std::borrow::Cow;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use routed_routing::{IdWidth, encode_npy, encode_raw_i32};
use routed_runtime::ModelInfo;
use routed_types::{ExpertId, RoutingMeta, RoutingRows};
use serde_json::{Value, json};

use crate::error::ApiError;

/// What a decoder layer without a routed MoE block holds in the decoder-layer layout: vLLM sizes
/// its capture buffer by `num_hidden_layers`, allocates it with zeros and writes MoE layers only,
/// so the other layers read 0. Clients tell them apart with `moe_layer_ids`.
pub const NON_MOE_FILL: ExpertId = 0;

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

/// Which layers the layer axis of returned rows holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RoutingLayers {
    /// Every decoder layer, indexed by layer id; layers without routed experts hold
    /// [`NON_MOE_FILL`] (the default: vLLM's and SGLang's layout).
    #[default]
    All,
    /// The MoE layers only, in model order (the compact layout the engine stores).
    Moe,
}

impl RoutingLayers {
    /// Parses the `routed_experts_layers` field.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "all" => Some(Self::All),
            "moe" => Some(Self::Moe),
            _ => None,
        }
    }

    /// The name clients send.
    pub fn name(self) -> &'static str {
        match self {
            Self::All => "all",
            Self::Moe => "moe",
        }
    }

    /// Length of the layer axis for `meta`.
    pub fn axis_len(self, meta: &RoutingMeta) -> usize {
        match self {
            Self::All => meta.num_layers as usize,
            Self::Moe => meta.num_moe_layers(),
        }
    }
}

/// What a request asked for: routing from row `start`, in `format`, over `layers`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoutingRequest {
    /// Rows before this one are dropped.
    pub start: usize,
    /// The encoding.
    pub format: RoutingFormat,
    /// The layer axis.
    pub layers: RoutingLayers,
    /// The request asked SGLang's way (`return_routed_experts: true`), so OpenAI responses also
    /// carry `sglext.routed_experts`, where SGLang's clients read it.
    pub sglext: bool,
}

/// The routing fields of a request, before validation.
#[derive(Clone, Debug, Default)]
pub(crate) struct RoutingFields {
    pub return_routed_experts: Option<bool>,
    pub start_len: Option<i64>,
    pub prompt_start: Option<i64>,
    pub format: Option<String>,
    pub layers: Option<String>,
}

/// The field that carries a request's routing start: the alias when only it was given.
pub(crate) fn start_param(fields: &RoutingFields) -> &'static str {
    match (fields.start_len, fields.prompt_start) {
        (None, Some(_)) => "routed_experts_prompt_start",
        _ => "routed_experts_start_len",
    }
}

/// Decides whether routing is returned and checks the offset's wire value, the format and the
/// layer axis. Routing is returned by default when the server captures it; asking for it
/// explicitly on a server that does not is a 400 naming the flag. Whether the start lies within
/// each prompt is the engine's rule (`routed_runtime::validate`).
pub(crate) fn resolve(
    info: &ModelInfo,
    fields: &RoutingFields,
) -> Result<Option<RoutingRequest>, ApiError> {
    let wanted = wanted(info, fields.return_routed_experts)?;
    let param = start_param(fields);
    let start = match (fields.start_len, fields.prompt_start) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid(
                "routed_experts_start_len",
                format!(
                    "routed_experts_start_len ({a}) and its alias routed_experts_prompt_start \
                     ({b}) disagree; give one of them"
                ),
            ));
        }
        (Some(a), _) => a,
        (None, Some(b)) => b,
        (None, None) => 0,
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
    let layers = match fields.layers.as_deref() {
        None => RoutingLayers::All,
        Some(name) => RoutingLayers::parse(name).ok_or_else(|| {
            ApiError::invalid(
                "routed_experts_layers",
                format!("unknown routed_experts_layers '{name}': use all or moe"),
            )
        })?,
    };
    if !wanted {
        return Ok(None);
    }
    let start = usize::try_from(start).map_err(|_| {
        ApiError::invalid(param, format!("{param} must be a non-negative integer, got {start}"))
    })?;
    let sglext = fields.return_routed_experts == Some(true);
    Ok(Some(RoutingRequest { start, format, layers, sglext }))
}

/// Whether routing is returned: by default when the server captures it; `true` on a server that
/// cannot is a 400 naming the reason.
fn wanted(info: &ModelInfo, asked: Option<bool>) -> Result<bool, ApiError> {
    let capture = info.routing_capture && info.routing.is_some();
    match (asked, capture) {
        (Some(false), _) | (None, false) => Ok(false),
        (Some(true), false) if info.routing.is_none() => Err(ApiError::invalid(
            "return_routed_experts",
            "this model has no MoE layers, so there is no routing to return",
        )),
        (Some(true), false) => Err(ApiError::invalid(
            "return_routed_experts",
            "routing capture is disabled on this server (--disable-return-routed-experts); \
             start it with --enable-return-routed-experts to request routed experts",
        )),
        (_, true) => Ok(true),
    }
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

/// The response-level `routed_experts_meta` object. `num_layers` is the model's decoder layer
/// count whatever the layout; the layer axis has that many entries with `all`, and
/// `num_moe_layers` with `moe`.
pub(crate) fn meta_json(meta: &RoutingMeta, request: RoutingRequest) -> Value {
    json!({
        "start": request.start,
        "layers": request.layers.name(),
        "num_layers": meta.num_layers,
        "num_moe_layers": meta.num_moe_layers(),
        "moe_layer_ids": meta.moe_layer_ids,
        "num_experts": meta.num_experts,
        "top_k": meta.top_k,
        "dtype": dtype_name(meta, request.format),
        "format": request.format.name(),
    })
}

/// The rows with the layer axis `layers` asks for. The MoE-only layout is the stored one; the
/// decoder-layer layout places each MoE layer's ids at its layer id and fills the others.
pub(crate) fn with_layers<'a>(
    rows: &'a RoutingRows,
    meta: &RoutingMeta,
    layers: RoutingLayers,
) -> Result<Cow<'a, RoutingRows>, ApiError> {
    check_layout(rows, meta)?;
    if layers == RoutingLayers::Moe {
        return Ok(Cow::Borrowed(rows));
    }
    let (num_layers, k) = (meta.num_layers as usize, rows.top_k);
    if let Some(&bad) = meta.moe_layer_ids.iter().find(|&&id| id as usize >= num_layers) {
        return Err(ApiError::Internal(format!(
            "MoE layer id {bad} is outside the model's {num_layers} decoder layers"
        )));
    }
    let mut ids = vec![NON_MOE_FILL; rows.num_rows * num_layers * k];
    for (r, out) in ids.chunks_exact_mut(num_layers * k).enumerate() {
        let stored = rows.row(r);
        for (j, &layer) in meta.moe_layer_ids.iter().enumerate() {
            let at = layer as usize * k;
            out[at..at + k].copy_from_slice(&stored[j * k..(j + 1) * k]);
        }
    }
    Ok(Cow::Owned(RoutingRows {
        start: rows.start,
        num_rows: rows.num_rows,
        num_moe_layers: num_layers,
        top_k: k,
        ids,
    }))
}

/// Encodes one choice's rows; `None` (a choice aborted before any forward) is JSON `null`.
pub(crate) fn encode(
    rows: Option<&RoutingRows>,
    meta: &RoutingMeta,
    request: RoutingRequest,
) -> Result<Value, ApiError> {
    let Some(rows) = rows else { return Ok(Value::Null) };
    let rows = with_layers(rows, meta, request.layers)?;
    let internal = |e: routed_routing::RoutingError| ApiError::Internal(e.to_string());
    Ok(match request.format {
        RoutingFormat::NpyB64 => {
            Value::String(STANDARD.encode(encode_npy(&rows, meta.num_experts).map_err(internal)?))
        }
        RoutingFormat::RawB64Int32 => {
            Value::String(STANDARD.encode(encode_raw_i32(&rows).map_err(internal)?))
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

/// Base64 of the flat int32 array and its `[rows, L, K]` shape, as SGLang returns them
/// (`/generate`'s `meta_info` and the OpenAI routes' `sglext`).
pub(crate) fn encode_sglang(
    rows: &RoutingRows,
    meta: &RoutingMeta,
    layers: RoutingLayers,
) -> Result<(String, [usize; 3]), ApiError> {
    let rows = with_layers(rows, meta, layers)?;
    let bytes = encode_raw_i32(&rows).map_err(|e| ApiError::Internal(e.to_string()))?;
    Ok((STANDARD.encode(bytes), rows.shape()))
}

/// The engine's rows must have the model's MoE layer axis; anything else is a bug, not bad input.
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
            checkpoint_dir: std::path::PathBuf::new(),
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
            kv_pool_sized_by_routing_cap: false,
            block_size: 16,
            num_snapshot_slots: 0,
            max_waiting_requests: 16,
            max_num_seqs: 8,
            max_num_batched_tokens: 64,
            prefix_caching: true,
            device: "cpu".into(),
            expert_parallel_size: 1,
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
            layers: None,
        }
    }

    fn param(err: ApiError) -> Option<String> {
        match err {
            ApiError::InvalidRequest { param, .. } => param,
            other => panic!("{other:?}"),
        }
    }

    fn request(format: RoutingFormat, layers: RoutingLayers) -> RoutingRequest {
        RoutingRequest { start: 0, format, layers, sglext: false }
    }

    /// Two rows over MoE layers 1 and 3 of a 4-layer model, top-2.
    fn rows() -> RoutingRows {
        RoutingRows {
            start: 0,
            num_rows: 2,
            num_moe_layers: 2,
            top_k: 2,
            ids: vec![0, 1, 2, 3, 4, 5, 6, 7],
        }
    }

    #[test]
    fn routing_is_on_by_default_and_refused_when_not_captured() {
        let on = info(true);
        let req = resolve(&on, &fields(None, None, None, None)).unwrap();
        assert_eq!(req, Some(request(RoutingFormat::NpyB64, RoutingLayers::All)));
        assert_eq!(resolve(&on, &fields(Some(false), None, None, None)).unwrap(), None);
        // Asking explicitly (SGLang's way) also asks for `sglext`.
        let explicit = resolve(&on, &fields(Some(true), None, None, None)).unwrap();
        assert!(explicit.unwrap().sglext);
        let off = info(false);
        assert_eq!(resolve(&off, &fields(None, None, None, None)).unwrap(), None);
        let err = resolve(&off, &fields(Some(true), None, None, None)).unwrap_err();
        assert!(err.to_string().contains("--enable-return-routed-experts"));
        assert_eq!(param(err).as_deref(), Some("return_routed_experts"));
    }

    #[test]
    fn start_offsets_formats_and_layers_are_checked() {
        let on = info(true);
        let ok = |f| resolve(&on, &f).unwrap().unwrap();
        assert_eq!(ok(fields(None, Some(4), Some(4), None)).start, 4);
        assert_eq!(ok(fields(None, None, Some(2), Some("list"))).format, RoutingFormat::List);
        let moe = RoutingFields { layers: Some("moe".into()), ..fields(None, None, None, None) };
        assert_eq!(ok(moe).layers, RoutingLayers::Moe);
        let bad = |f| param(resolve(&on, &f).unwrap_err());
        assert_eq!(start_param(&fields(None, Some(5), Some(5), None)), "routed_experts_start_len");
        assert_eq!(start_param(&fields(None, None, Some(5), None)), "routed_experts_prompt_start");
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
        let layers =
            RoutingFields { layers: Some("dense".into()), ..fields(None, None, None, None) };
        assert_eq!(bad(layers).as_deref(), Some("routed_experts_layers"));
    }

    #[test]
    fn the_decoder_layer_layout_places_moe_layers_at_their_ids() {
        let meta = info(true).routing.unwrap();
        let stored = rows();
        let all = with_layers(&stored, &meta, RoutingLayers::All).unwrap();
        assert_eq!(all.shape(), [2, 4, 2]);
        let f = NON_MOE_FILL;
        assert_eq!(all.ids, vec![f, f, 0, 1, f, f, 2, 3, f, f, 4, 5, f, f, 6, 7]);
        let moe = with_layers(&stored, &meta, RoutingLayers::Moe).unwrap();
        assert!(matches!(moe, Cow::Borrowed(_)));
        let bad = RoutingMeta { num_layers: 3, ..meta };
        assert!(matches!(
            with_layers(&stored, &bad, RoutingLayers::All),
            Err(ApiError::Internal(_))
        ));
    }

    #[test]
    fn encodings_agree() {
        let meta = info(true).routing.unwrap();
        let list = encode(Some(&rows()), &meta, request(RoutingFormat::List, RoutingLayers::Moe));
        assert_eq!(list.unwrap(), json!([[[0, 1], [2, 3]], [[4, 5], [6, 7]]]));
        let all = encode(Some(&rows()), &meta, request(RoutingFormat::List, RoutingLayers::All));
        assert_eq!(all.unwrap()[1], json!([[0, 0], [4, 5], [0, 0], [6, 7]]));
        let raw =
            encode(Some(&rows()), &meta, request(RoutingFormat::RawB64Int32, RoutingLayers::All));
        let bytes = STANDARD.decode(raw.unwrap().as_str().unwrap()).unwrap();
        assert_eq!(bytes.len(), 2 * 4 * 2 * 4);
        assert_eq!(&bytes[8..12], &0i32.to_le_bytes());
        assert_eq!(&bytes[12..16], &1i32.to_le_bytes());
        let (sgl, shape) = encode_sglang(&rows(), &meta, RoutingLayers::All).unwrap();
        assert_eq!(STANDARD.decode(sgl).unwrap(), bytes);
        assert_eq!(shape, [2, 4, 2]);
        let npy = request(RoutingFormat::NpyB64, RoutingLayers::All);
        assert_eq!(encode(None, &meta, npy).unwrap(), Value::Null);
        let short = RoutingRows { ids: vec![0; 3], ..rows() };
        assert!(matches!(encode(Some(&short), &meta, npy), Err(ApiError::Internal(_))));
    }

    #[test]
    fn meta_names_the_layout_and_the_dtype_of_the_encoding() {
        let meta = info(true).routing.unwrap();
        let m = meta_json(&meta, request(RoutingFormat::RawB64Int32, RoutingLayers::All));
        assert_eq!(
            m,
            json!({"start": 0, "layers": "all", "num_layers": 4, "num_moe_layers": 2,
                   "moe_layer_ids": [1, 3], "num_experts": 8, "top_k": 2, "dtype": "int32",
                   "format": "raw_b64_int32"})
        );
        let m = meta_json(&meta, request(RoutingFormat::NpyB64, RoutingLayers::Moe));
        assert_eq!((m["layers"].as_str(), m["dtype"].as_str()), (Some("moe"), Some("uint8")));
    }
}
