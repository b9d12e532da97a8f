//! `response_format: {"type": "json_schema"}` on both OpenAI routes, vLLM's
//! `structured_outputs.json` and `guided_json`, and SGLang's `sampling_params.json_schema` on
//! `/generate`: every answer EOS ended is a value of the schema (its required keys in order, its
//! enum, its integers and bounded numbers, its nested `$ref` objects), the others a prefix of
//! one; a schema with a constraint the reader cannot keep is a 400 naming the field. The tiny
//! checkpoint writes no JSON by itself, so what holds is the constraint's doing.

mod common;

use common::{TestServer, answers, on_both_routes, streamed_content, test_config};
use routed_test_support::json_object_prefix;
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// A forecast request, as a tool's parameters are written: required and optional properties,
/// a bounded string, an enum, an integer and a number in ranges, a bounded list of objects from
/// `$defs` and a nullable field.
fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "where", "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "rating": {"type": "number", "exclusiveMinimum": -1, "maximum": 2.5},
            "units": {"enum": ["celsius", "fahrenheit"]},
            "alerts": {"type": "array", "items": {"$ref": "#/$defs/Alert"}, "maxItems": 2}
        },
        "required": ["city", "rating", "units"],
        "$defs": {
            "Alert": {
                "type": "object",
                "properties": {
                    "level": {"type": "integer"},
                    "note": {"anyOf": [{"type": "string"}, {"type": "null"}]}
                },
                "required": ["level", "note"]
            }
        }
    })
}

/// Whether `value` is one the schema allows, its keys in the schema's order.
fn conforms(value: &Value) -> bool {
    let Some(object) = value.as_object() else { return false };
    let order = ["city", "days", "rating", "units", "alerts"];
    let mut at = 0;
    for key in object.keys() {
        match order[at..].iter().position(|k| k == key) {
            Some(i) => at += i + 1,
            None => return false,
        }
    }
    let alert = |a: &Value| {
        a.as_object().is_some_and(|a| {
            a.len() == 2
                && a.get("level").is_some_and(|l| l.is_i64() || l.is_u64())
                && a.get("note").is_some_and(|n| n.is_string() || n.is_null())
        })
    };
    let city = object.get("city").and_then(Value::as_str);
    city.is_some_and(|c| c.chars().count() <= 12)
        && object.get("days").is_none_or(|d| d.as_i64().is_some_and(|d| (1..=7).contains(&d)))
        && object.get("rating").and_then(Value::as_f64).is_some_and(|r| r > -1.0 && r <= 2.5)
        && object.get("units").is_some_and(|u| u == "celsius" || u == "fahrenheit")
        && object
            .get("alerts")
            .is_none_or(|a| a.as_array().is_some_and(|a| a.len() <= 2 && a.iter().all(alert)))
}

/// Checks an answer: a value of the schema if EOS ended it, else the start of an object.
/// Returns whether it was whole.
fn check(text: &str, finish: &str, what: &str) -> bool {
    let prefix = json_object_prefix(text).unwrap_or_else(|| panic!("{what}: not JSON: {text:?}"));
    if finish != "stop" {
        return false;
    }
    assert!(prefix, "{what}: stopped in {text:?}");
    // Read as the client would; a number past an f64's range is JSON, but not this schema's.
    let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(conforms(&value), "{what}: {text}");
    true
}

#[test]
fn answers_are_values_of_the_schema_however_it_is_asked_for() {
    let s = TestServer::start(test_config(MODEL));
    let format = json!({"type": "json_schema",
                        "json_schema": {"name": "forecast", "strict": true, "schema": schema()}});
    let mut num_whole = 0;
    for seed in 0..4 {
        let sampling = json!({"max_tokens": 96, "temperature": 1.0, "seed": seed, "n": 3,
                              "response_format": format});
        for (route, body) in on_both_routes(&sampling, "Forecast in JSON:", "Forecast in JSON.") {
            for (text, finish) in answers(&s.ok(route, &body)) {
                num_whole += usize::from(check(&text, &finish, &format!("{route} seed {seed}")));
            }
        }
    }
    assert!(num_whole > 0, "no answer closed its value");

    // vLLM's spellings (a schema as JSON text too), compact; and SGLang's.
    let mut num_whole = 0;
    for seed in 0..4 {
        let structured = json!({"prompt": "Forecast:", "max_tokens": 96, "temperature": 1.0,
                                "seed": seed, "n": 2,
                                "structured_outputs": {"json": schema(),
                                                       "disable_any_whitespace": true}});
        for (text, finish) in answers(&s.ok("/v1/completions", &structured)) {
            num_whole += usize::from(check(&text, &finish, &format!("structured {seed}")));
            assert!(!text.contains(['\n', '\t']), "compact: {text:?}");
        }
        // vLLM's older field, and SGLang's top-level one on its OpenAI routes.
        for field in ["guided_json", "json_schema"] {
            let mut body = json!({"prompt": "Forecast:", "max_tokens": 96, "temperature": 1.0,
                                  "seed": seed});
            body[field] = json!(schema().to_string());
            for (text, finish) in answers(&s.ok("/v1/completions", &body)) {
                num_whole += usize::from(check(&text, &finish, &format!("{field} {seed}")));
            }
        }
        let generate = json!({"text": "Forecast:", "sampling_params": {
            "max_new_tokens": 96, "temperature": 1.0, "sampling_seed": seed,
            "json_schema": schema().to_string()}});
        let out = s.ok("/generate", &generate);
        let finish = out["meta_info"]["finish_reason"]["type"].as_str().unwrap();
        let text = out["text"].as_str().unwrap();
        num_whole += usize::from(check(text, finish, &format!("/generate {seed}")));
    }
    assert!(num_whole > 0, "no answer closed its value");
}

#[test]
fn an_answer_streamed_is_the_whole_ones() {
    let s = TestServer::start(test_config(MODEL));
    let format = json!({"type": "json_schema", "json_schema": {"name": "f", "schema": schema()}});
    for seed in 1..3 {
        let body = json!({"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 64,
                          "temperature": 1.0, "seed": seed, "response_format": format});
        let whole = answers(&s.ok("/v1/chat/completions", &body)).remove(0).0;
        let streamed = streamed_content(&s, &body);
        assert_eq!(streamed, whole, "seed {seed}");
    }
}

#[test]
fn schemas_the_reader_cannot_keep_are_refused_by_name() {
    let s = TestServer::start(test_config(MODEL));
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let with_multiple =
        json!({"type": "object", "properties": {"d": {"type": "integer", "multipleOf": 2}}});
    let format = |schema: Value| json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}});
    for (field, value, param, code, says) in [
        (
            "response_format",
            format(with_multiple.clone()),
            "response_format.json_schema.schema",
            "unsupported_parameter",
            "\"multipleOf\" is not supported (at #/properties/d)",
        ),
        (
            "response_format",
            json!({"type": "json_schema"}),
            "response_format.json_schema",
            "missing_required_parameter",
            "json_schema",
        ),
        (
            "response_format",
            format(json!({"type": "array", "minItems": 2, "maxItems": 1})),
            "response_format.json_schema.schema",
            "invalid_value",
            "maxItems",
        ),
        ("guided_json", json!("{\"type\": "), "guided_json", "invalid_value", "not JSON"),
        ("guided_json", json!(7), "guided_json", "invalid_type", "JSON schema"),
        (
            "structured_outputs",
            json!({"json": with_multiple, "json_object": true}),
            "structured_outputs",
            "invalid_value",
            "give one of them",
        ),
    ] {
        let mut body = chat.clone();
        body[field] = value;
        let error = s.post("/v1/chat/completions", &body).error(400, "invalid_request_error");
        assert_eq!(
            (error["param"].as_str(), error["code"].as_str()),
            (Some(param), Some(code)),
            "{field}: {error}"
        );
        assert!(error["message"].as_str().unwrap().contains(says), "{error}");
    }
    // Two fields that each constrain the output.
    let mut body = chat.clone();
    body["response_format"] = json!({"type": "json_object"});
    body["guided_json"] = schema();
    let error = s.post("/v1/chat/completions", &body).error(400, "invalid_request_error");
    assert_eq!(error["param"], "response_format", "{error}");
    let generate = json!({"input_ids": [1, 2, 3],
                          "sampling_params": {"max_new_tokens": 2, "json_schema": "{\"minimum\": 1}"}});
    let error = s.post("/generate", &generate).error(400, "invalid_request_error");
    assert_eq!(error["param"], "sampling_params.json_schema", "{error}");
    assert_eq!(s.registry.len(), 0, "nothing ran");
}

#[test]
fn a_choice_answers_exactly_one_of_its_texts() {
    let s = TestServer::start(test_config(MODEL));
    let options = ["yes", "no", "not sure"];
    let mut num_whole = 0;
    for seed in 0..4 {
        for field in ["structured_outputs", "guided_choice"] {
            let mut body = json!({"prompt": "Is it?", "max_tokens": 8, "temperature": 1.0,
                                  "seed": seed, "n": 2});
            body[field] = match field {
                "guided_choice" => json!(options),
                _ => json!({"choice": options}),
            };
            for (text, finish) in answers(&s.ok("/v1/completions", &body)) {
                assert!(options.iter().any(|o| o.starts_with(&text)), "{field} {seed}: {text:?}");
                if finish == "stop" {
                    assert!(options.contains(&text.as_str()), "{field} {seed}: {text:?}");
                    num_whole += 1;
                }
            }
        }
    }
    assert!(num_whole > 0, "no answer ended");
    for (field, value, param) in [
        ("structured_outputs", json!({"choice": []}), "structured_outputs.choice"),
        ("structured_outputs", json!({"choice": ["a", 1]}), "structured_outputs.choice"),
        ("structured_outputs", json!({"choice": ["a"], "json_object": true}), "structured_outputs"),
        ("guided_choice", json!(["a", ""]), "guided_choice"),
    ] {
        let mut body = json!({"prompt": "hi", "max_tokens": 2});
        body[field] = value;
        let error = s.post("/v1/completions", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], param, "{error}");
    }
}
