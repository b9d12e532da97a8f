//! Structural tags from requests, as SGLang and vLLM take them: `{"structures": [{"begin",
//! "schema", "end"}, ...], "triggers": [...]}` (with `"type": "structural_tag"` in
//! `response_format`), given as an object or as its JSON text.

use std::sync::Arc;

use routed_types::{StructuralTag, TagStructure};
use serde_json::Value;

use super::sampling::schema_of;
use crate::error::ApiError;

/// The structural tag a request's field `param` gives, each structure's schema reduced; a tag
/// the engine cannot follow is a 400 naming the field and the reason.
pub(crate) fn structural_tag_of(value: &Value, param: &str) -> Result<StructuralTag, ApiError> {
    let parsed;
    let tag = match value {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text)
                .map_err(|e| ApiError::invalid(param, format!("{param} is not JSON: {e}")))?;
            &parsed
        }
        other => other,
    };
    let wrong = |what: &str| ApiError::InvalidRequest {
        message: format!("{param}: {what}"),
        param: Some(param.to_owned()),
        code: "invalid_type",
    };
    if tag.get("format").is_some() {
        return Err(ApiError::unsupported(
            param,
            format!(
                "{param}: the \"format\" form of a structural tag is not supported; give \
                 \"structures\" and \"triggers\""
            ),
        ));
    }
    let structures = tag.get("structures").and_then(Value::as_array);
    let triggers = tag.get("triggers").and_then(Value::as_array);
    let (Some(structures), Some(triggers)) = (structures, triggers) else {
        return Err(wrong("a structural tag is {\"structures\": [...], \"triggers\": [...]}"));
    };
    let triggers = triggers
        .iter()
        .map(|t| t.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| wrong("triggers must be strings"))?;
    let structures = structures
        .iter()
        .enumerate()
        .map(|(i, s)| structure(s, &format!("{param}.structures[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    let tag = StructuralTag { structures, triggers };
    match tag.problem() {
        Some(problem) => Err(ApiError::invalid(param, format!("{param}: {problem}"))),
        None => Ok(tag),
    }
}

/// One structure, `param` naming it: its begin and end texts, and its schema (any JSON value
/// when it has none).
fn structure(value: &Value, param: &str) -> Result<TagStructure, ApiError> {
    let text = |key: &str| value.get(key).and_then(Value::as_str).map(str::to_owned);
    let (Some(begin), Some(end)) = (text("begin"), text("end")) else {
        return Err(ApiError::InvalidRequest {
            message: format!("{param} must be {{\"begin\": ..., \"schema\": ..., \"end\": ...}}"),
            param: Some(param.to_owned()),
            code: "invalid_type",
        });
    };
    let any = Value::Bool(true);
    let schema = value.get("schema").filter(|v| !v.is_null()).unwrap_or(&any);
    let schema = Arc::new(schema_of(schema, &format!("{param}.schema"))?);
    Ok(TagStructure { begin, schema, end })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tag_is_read_from_an_object_or_its_text() {
        let tag = json!({"type": "structural_tag", "triggers": ["<f="],
                         "structures": [{"begin": "<f=a>", "schema": {"type": "integer"},
                                         "end": "</f>"}, {"begin": "<f=b>", "end": "</f>"}]});
        let read = structural_tag_of(&tag, "response_format").unwrap();
        assert_eq!(read.structures.len(), 2);
        assert_eq!(read.triggers, ["<f="]);
        let text = Value::String(tag.to_string());
        assert_eq!(structural_tag_of(&text, "structured_outputs.structural_tag").unwrap(), read);
    }

    #[test]
    fn a_tag_the_engine_cannot_follow_is_a_400_naming_the_field() {
        for (tag, says) in [
            (json!({"structures": [], "triggers": ["<"]}), "1 to 64"),
            (json!({"structures": [{"begin": "x", "end": "y"}], "triggers": ["<"]}), "no trigger"),
            (json!({"structures": [{"begin": "<a"}], "triggers": ["<"]}), "structures[0]"),
            (json!({"triggers": ["<"]}), "structures"),
            (json!({"format": {"type": "tag"}}), "not supported"),
            (json!("{not json"), "not JSON"),
            (
                json!({"structures": [{"begin": "<a", "end": ">", "schema": {"type": "nope"}}],
                       "triggers": ["<"]}),
                "schema",
            ),
        ] {
            let e = structural_tag_of(&tag, "response_format").unwrap_err().to_string();
            assert!(e.contains(says), "{tag}: {e}");
        }
    }
}
