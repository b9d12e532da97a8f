//! Structural tags from requests, as SGLang and vLLM take them: `{"structures": [{"begin",
//! "schema", "end"}, ...], "triggers": [...]}` (with `"type": "structural_tag"` in
//! `response_format`), given as an object or as its JSON text; or xgrammar's newer `"format"`
//! form where it says the same: a `triggered_tags` format (with its `at_least_one`,
//! `stop_after_first` and `excludes`) or a single `tag`, each tag's content a `json_schema`.

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
    let tag = match tag.get("format") {
        Some(format) => format_tag(format, &format!("{param}.format"))?,
        None => legacy_tag(tag, param)?,
    };
    match tag.problem() {
        Some(problem) => Err(ApiError::invalid(param, format!("{param}: {problem}"))),
        None => Ok(tag),
    }
}

/// A field of the wrong type: a 400 naming it.
fn wrong_type(param: &str, what: &str) -> ApiError {
    ApiError::InvalidRequest {
        message: format!("{param}: {what}"),
        param: Some(param.to_owned()),
        code: "invalid_type",
    }
}

/// The strings of the list `value` (`param` names it; absent: none).
fn strings(value: Option<&Value>, param: &str) -> Result<Vec<String>, ApiError> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(Vec::new()) };
    let list = value.as_array().ok_or_else(|| wrong_type(param, "must be a list of strings"))?;
    let each = |v: &Value| v.as_str().map(str::to_owned);
    list.iter()
        .map(each)
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| wrong_type(param, "must be a list of strings"))
}

/// xgrammar's `format` form, `param` naming it: a `triggered_tags` format, or one `tag` (read as
/// the tag alone: its begin text is its trigger, the output starts with it and ends after it).
fn format_tag(format: &Value, param: &str) -> Result<StructuralTag, ApiError> {
    let kind = format.get("type").and_then(Value::as_str);
    let flag = |key: &str| match format.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(wrong_type(&format!("{param}.{key}"), "must be a boolean")),
    };
    match kind {
        Some("triggered_tags") => {
            let tags = format.get("tags").and_then(Value::as_array);
            let tags =
                tags.ok_or_else(|| wrong_type(&format!("{param}.tags"), "must be a list of tags"))?;
            let structures = tags
                .iter()
                .enumerate()
                .map(|(i, t)| format_structure(t, &format!("{param}.tags[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            let triggers = strings(format.get("triggers"), &format!("{param}.triggers"))?;
            Ok(StructuralTag {
                at_least_one: flag("at_least_one")?,
                stop_after_first: flag("stop_after_first")?,
                excludes: strings(format.get("excludes"), &format!("{param}.excludes"))?,
                ..StructuralTag::new(structures, triggers)
            })
        }
        Some("tag") => {
            let structure = format_structure(format, param)?;
            let trigger = structure.begin.clone();
            Ok(StructuralTag {
                at_least_one: true,
                stop_after_first: true,
                ..StructuralTag::new(vec![structure], vec![trigger])
            })
        }
        Some(other) => Err(ApiError::unsupported(
            &format!("{param}.type"),
            format!(
                "{param}: a \"{other}\" format is not supported; routed follows \
                 \"triggered_tags\" and \"tag\" formats whose tags hold a \"json_schema\""
            ),
        )),
        None => Err(wrong_type(&format!("{param}.type"), "a format names its \"type\"")),
    }
}

/// One `tag` of the `format` form, `param` naming it: string begin and end (a list of one end
/// too), and a `json_schema` content in JSON style.
fn format_structure(tag: &Value, param: &str) -> Result<TagStructure, ApiError> {
    let unsupported = |key: &str, what: &str| {
        ApiError::unsupported(&format!("{param}.{key}"), format!("{param}.{key}: {what}"))
    };
    if let Some(kind) = tag.get("type").and_then(Value::as_str).filter(|&k| k != "tag") {
        return Err(unsupported("type", &format!("a \"{kind}\" is not a tag")));
    }
    let begin = match tag.get("begin") {
        Some(Value::String(begin)) => begin.clone(),
        Some(Value::Object(_)) => {
            return Err(unsupported("begin", "token begins are not supported"));
        }
        _ => return Err(wrong_type(&format!("{param}.begin"), "must be a string")),
    };
    let end = match tag.get("end") {
        Some(Value::String(end)) => end.clone(),
        Some(Value::Array(ends)) if ends.len() == 1 && ends[0].is_string() => {
            ends[0].as_str().unwrap_or_default().to_owned()
        }
        Some(Value::Array(_)) => return Err(unsupported("end", "one end text is supported")),
        Some(Value::Object(_)) => return Err(unsupported("end", "token ends are not supported")),
        _ => return Err(wrong_type(&format!("{param}.end"), "must be a string")),
    };
    let content = tag.get("content").filter(|c| c.is_object());
    let content =
        content.ok_or_else(|| wrong_type(&format!("{param}.content"), "must be a format"))?;
    match content.get("type").and_then(Value::as_str) {
        Some("json_schema") => {}
        Some(other) => {
            return Err(unsupported(
                "content.type",
                &format!("a tag holding a \"{other}\" is not supported, only a \"json_schema\""),
            ));
        }
        None => {
            return Err(wrong_type(
                &format!("{param}.content.type"),
                "a format names its \"type\"",
            ));
        }
    }
    if content.get("style").is_some_and(|s| !s.is_null() && s != "json") {
        return Err(unsupported("content.style", "only the \"json\" style is supported"));
    }
    if content.get("any_order") == Some(&Value::Bool(true)) {
        return Err(unsupported("content.any_order", "properties are read in schema order"));
    }
    let any = Value::Bool(true);
    let schema = content.get("json_schema").filter(|v| !v.is_null()).unwrap_or(&any);
    let schema = Arc::new(schema_of(schema, &format!("{param}.content.json_schema"))?);
    Ok(TagStructure { begin, schema, end })
}

/// The legacy form, `{"structures": [...], "triggers": [...]}`, `param` naming it.
fn legacy_tag(tag: &Value, param: &str) -> Result<StructuralTag, ApiError> {
    let structures = tag.get("structures").and_then(Value::as_array);
    let triggers = tag.get("triggers").and_then(Value::as_array);
    let (Some(structures), Some(triggers)) = (structures, triggers) else {
        return Err(wrong_type(
            param,
            "a structural tag is {\"structures\": [...], \"triggers\": [...]} or {\"format\": ...}",
        ));
    };
    let triggers = triggers
        .iter()
        .map(|t| t.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| wrong_type(param, "triggers must be strings"))?;
    let structures = structures
        .iter()
        .enumerate()
        .map(|(i, s)| structure(s, &format!("{param}.structures[{i}]")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(StructuralTag::new(structures, triggers))
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
            (json!({"format": {"type": "any_text"}}), "not supported"),
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

    /// xgrammar's `tag` holding a schema, as the format form writes it.
    fn format_tag_json(begin: &str, schema: Value) -> Value {
        json!({"type": "tag", "begin": begin,
               "content": {"type": "json_schema", "json_schema": schema}, "end": "</f>"})
    }

    #[test]
    fn the_format_form_reads_as_the_legacy_form_says_the_same() {
        let legacy = json!({"triggers": ["<f="],
                            "structures": [{"begin": "<f=a>", "schema": {"type": "integer"},
                                            "end": "</f>"}]});
        let format = json!({"type": "structural_tag", "format": {"type": "triggered_tags",
            "triggers": ["<f="], "tags": [format_tag_json("<f=a>", json!({"type": "integer"}))]}});
        let want = structural_tag_of(&legacy, "response_format").unwrap();
        assert_eq!(structural_tag_of(&format, "response_format").unwrap(), want);
        // The flags and excludes are kept.
        let mut flagged = format.clone();
        flagged["format"]["at_least_one"] = json!(true);
        flagged["format"]["stop_after_first"] = json!(true);
        flagged["format"]["excludes"] = json!(["</r>"]);
        let read = structural_tag_of(&flagged, "response_format").unwrap();
        assert!(read.at_least_one && read.stop_after_first);
        assert_eq!(read.excludes, ["</r>"]);
        // One tag alone: the output is that tag, its begin the trigger.
        let alone = json!({"format": format_tag_json("<f=a>", json!({"type": "integer"}))});
        let read = structural_tag_of(&alone, "response_format").unwrap();
        assert!(read.at_least_one && read.stop_after_first);
        assert_eq!((read.triggers, read.structures), (vec!["<f=a>".to_owned()], want.structures));
    }

    #[test]
    fn formats_beyond_tags_of_schemas_are_refused_naming_where() {
        let tag = format_tag_json("<f=a>", json!({"type": "integer"}));
        let triggered = |tag: Value| json!({"format": {"type": "triggered_tags", "triggers": ["<f="], "tags": [tag]}});
        let mut any_text = tag.clone();
        any_text["content"] = json!({"type": "any_text"});
        let mut xml = tag.clone();
        xml["content"]["style"] = json!("qwen_xml");
        let mut two_ends = tag.clone();
        two_ends["end"] = json!(["</f>", "</g>"]);
        let mut token = tag.clone();
        token["begin"] = json!({"type": "token", "token": 5});
        for (body, param, code) in [
            (
                json!({"format": {"type": "sequence", "elements": []}}),
                "rf.format.type",
                "unsupported_parameter",
            ),
            (triggered(any_text), "rf.format.tags[0].content.type", "unsupported_parameter"),
            (triggered(xml), "rf.format.tags[0].content.style", "unsupported_parameter"),
            (triggered(two_ends), "rf.format.tags[0].end", "unsupported_parameter"),
            (triggered(token), "rf.format.tags[0].begin", "unsupported_parameter"),
            (json!({"format": {"triggers": []}}), "rf.format.type", "invalid_type"),
            (
                json!({"format": {"type": "triggered_tags", "tags": [tag], "triggers": [1]}}),
                "rf.format.triggers",
                "invalid_type",
            ),
        ] {
            let ApiError::InvalidRequest { param: got, code: got_code, .. } =
                structural_tag_of(&body, "rf").unwrap_err()
            else {
                panic!("{body}")
            };
            assert_eq!((got.as_deref(), got_code), (Some(param), code), "{body}");
        }
    }
}
