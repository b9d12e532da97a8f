use super::*;
use serde_json::json;

const PARAM: &str = "response_format.json_schema.schema";

fn reduced(schema: Value) -> JsonSchema {
    reduce(&schema, PARAM).unwrap_or_else(|e| panic!("{schema}: {e:?}"))
}

/// The 400 a schema gets: its code and message.
fn refusal(schema: Value) -> (&'static str, String) {
    match reduce(&schema, PARAM) {
        Err(ApiError::InvalidRequest { message, param, code }) => {
            assert_eq!(param.as_deref(), Some(PARAM), "{schema}");
            (code, message)
        }
        other => panic!("{schema}: {other:?}"),
    }
}

fn node(schema: &JsonSchema, id: SchemaNodeId) -> &SchemaNode {
    schema.node(id)
}

#[test]
fn an_object_keeps_its_properties_in_order_with_what_is_required() {
    let schema = reduced(json!({
        "title": "Weather", "type": "object", "additionalProperties": false,
        "properties": {
            "city": {"type": "string", "description": "where", "format": "hostname"},
            "days": {"type": "integer", "default": 1},
            "units": {"enum": ["c", "f", 3], "type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
            "extra": {"type": ["string", "null"]},
            "ok": {"type": "boolean"}
        },
        "required": ["city", "days"]
    }));
    let SchemaNode::Object { properties } = node(&schema, JsonSchema::ROOT) else { panic!() };
    let keys: Vec<_> = properties.iter().map(|p| (p.key.as_str(), p.required)).collect();
    assert_eq!(
        keys,
        [
            ("\"city\"", true),
            ("\"days\"", true),
            ("\"units\"", false),
            ("\"tags\"", false),
            ("\"extra\"", false),
            ("\"ok\"", false)
        ]
    );
    let value = |i: usize| node(&schema, properties[i].value);
    assert_eq!(value(0), &SchemaNode::String);
    assert_eq!(value(1), &SchemaNode::Number { integer: true });
    // The enum's values of the schema's type only.
    assert_eq!(value(2), &SchemaNode::Literals(vec!["\"c\"".into(), "\"f\"".into()]));
    // ... and within its bounds.
    let bounded = reduced(json!({"type": "integer", "enum": [1, 50, 10], "maximum": 10}));
    assert_eq!(bounded.nodes, [SchemaNode::Literals(vec!["1".into(), "10".into()])]);
    let short = reduced(json!({"enum": ["é", "ab", 7], "maxLength": 1, "exclusiveMaximum": 7}));
    assert_eq!(short.nodes, [SchemaNode::Literals(vec!["\"é\"".into()])]);
    let SchemaNode::Array { items, min_items: 1, max_items: Some(3), .. } = value(3) else {
        panic!("{:?}", value(3))
    };
    assert_eq!(node(&schema, *items), &SchemaNode::String);
    let SchemaNode::AnyOf(types) = value(4) else { panic!("{:?}", value(4)) };
    let types: Vec<_> = types.iter().map(|&t| node(&schema, t).clone()).collect();
    assert_eq!(types, [SchemaNode::String, SchemaNode::Literals(vec!["null".into()])]);
    assert_eq!(value(5), &SchemaNode::Literals(vec!["true".into(), "false".into()]));
    let bounded = reduced(json!({"type": "string", "minLength": 1, "maxLength": 8}));
    let want = SchemaNode::BoundedString { min_length: 1, max_length: Some(8) };
    assert_eq!(node(&bounded, JsonSchema::ROOT), &want);
    let int = |schema: Value| node(&reduced(schema), JsonSchema::ROOT).clone();
    let bounded = |minimum, maximum| SchemaNode::BoundedInteger { minimum, maximum };
    assert_eq!(
        int(json!({"type": "integer", "minimum": 1, "maximum": 7})),
        bounded(Some(1), Some(7))
    );
    assert_eq!(
        int(
            json!({"type": "integer", "exclusiveMinimum": 0.5, "maximum": 9.9, "exclusiveMaximum": 10})
        ),
        bounded(Some(1), Some(9))
    );
    assert_eq!(
        int(json!({"type": "integer", "minimum": -1e30})),
        SchemaNode::Number { integer: true }
    );
    assert_eq!(
        int(json!({"type": "integer", "minimum": -1e30, "maximum": -2})),
        bounded(None, Some(-2))
    );
    // A number's bounds on the grid of 18 places: exact where the bound has at most 18, else
    // rounded inward and held; of a bound and an exclusive one at one value, the exclusive.
    let number = |minimum, maximum| SchemaNode::BoundedNumber { minimum, maximum };
    let at = |units, inclusive| Some(NumberBound { units, inclusive });
    const ONE: i128 = NumberBound::ONE;
    for (schema, want) in [
        (json!({"minimum": 0, "maximum": 1}), number(at(0, true), at(ONE, true))),
        (
            json!({"exclusiveMinimum": 0.1, "maximum": 2.5, "exclusiveMaximum": 2.5}),
            number(at(ONE / 10, false), at(5 * ONE / 2, false)),
        ),
        (json!({"minimum": -0.3}), number(at(-3 * ONE / 10, true), None)),
        (json!({"exclusiveMinimum": 1e-20}), number(at(1, true), None)),
        (json!({"exclusiveMaximum": -1e-20}), number(None, at(-1, true))),
        (json!({"maximum": 1e-20, "minimum": -1e-20}), number(at(0, true), at(0, true))),
        (json!({"maximum": 1e18}), number(None, at(ONE * ONE, true))),
    ] {
        let mut schema = schema;
        schema["type"] = json!("number");
        assert_eq!(int(schema.clone()), want, "{schema}");
    }
    // Tuples: `prefixItems` in turn, then `items` (none with `items: false`).
    let pair = reduced(json!({
        "type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}],
        "minItems": 2, "maxItems": 2
    }));
    let SchemaNode::Array { prefix_items, min_items: 2, max_items: Some(2), .. } =
        node(&pair, JsonSchema::ROOT)
    else {
        panic!("{pair:?}")
    };
    let firsts: Vec<_> = prefix_items.iter().map(|&i| node(&pair, i).clone()).collect();
    assert_eq!(firsts, [SchemaNode::Number { integer: true }, SchemaNode::String]);
    let closed = reduced(json!({"prefixItems": [{"type": "string"}], "items": false}));
    let SchemaNode::Array { prefix_items, min_items: 0, max_items: Some(1), .. } =
        node(&closed, JsonSchema::ROOT)
    else {
        panic!("{closed:?}")
    };
    assert_eq!(prefix_items.len(), 1);
    let rest =
        reduced(json!({"type": "array", "prefixItems": [{"const": 1}], "items": {"type": "null"}}));
    let SchemaNode::Array { items, max_items: None, .. } = node(&rest, JsonSchema::ROOT) else {
        panic!("{rest:?}")
    };
    assert_eq!(node(&rest, *items), &SchemaNode::Literals(vec!["null".into()]));
    // The formats a pattern spells exactly are read through one; any other is an annotation.
    let formatted = |format: &str| {
        let schema = reduced(json!({"type": "string", "format": format, "maxLength": 40}));
        match node(&schema, JsonSchema::ROOT) {
            SchemaNode::PatternString { pattern, max_length: Some(40), .. } => {
                Some(pattern.clone())
            }
            SchemaNode::BoundedString { .. } => None,
            other => panic!("{format}: {other:?}"),
        }
    };
    for (format, valid, invalid) in [
        (
            "date",
            &["2026-11-27", "0001-01-01", "2023-12-31", "2024-04-30", "1999-02-28"][..],
            &[
                "0000-01-01",
                "2024-02-29",
                "2023-04-31",
                "2023-13-01",
                "2023-00-10",
                "2023-1-01",
                "20231-01-01",
            ][..],
        ),
        (
            "time",
            &["23:59:59Z", "00:00:00.123456+05:30", "12:30:00-08:00"][..],
            &["24:00:00Z", "12:00:60Z", "12:00:00", "12:00Z", "12:00:00.1234567Z", "12:00:00z"][..],
        ),
        (
            "date-time",
            &["2026-11-27T17:40:09Z", "2024-02-28T00:00:00.5+14:00"][..],
            &["2026-11-27 17:40:09Z", "2026-11-27T17:40:09", "2026-11-31T00:00:00Z"][..],
        ),
        (
            "uuid",
            &["123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"][..],
            &["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"][..],
        ),
        (
            "duration",
            &["P1D", "PT0S", "P2DT1H30M", "PT12M5S", "P999999DT1H2M3S", "PT1H"][..],
            &["P", "PT", "P1DT", "PT1.5S", "PT1H2S", "P1W", "P1Y2M", "1D", "PT1S2M"][..],
        ),
        (
            "ipv4",
            &["0.0.0.0", "255.255.255.255", "10.1.20.199"][..],
            &["256.1.1.1", "01.1.1.1", "1.1.1"][..],
        ),
        (
            "ipv6",
            &["2001:db8:0:0:0:0:0:1", "FFFF:ffff:1:2:3:4:5:0000"][..],
            &["2001:db8::1", "1:2:3:4:5:6:7", "1:2:3:4:5:6:7:8:9", "12345:0:0:0:0:0:0:1"][..],
        ),
    ] {
        let pattern = formatted(format).unwrap_or_else(|| panic!("{format} read as a pattern"));
        for text in valid {
            assert!(pattern.matches(text.as_bytes()), "{format}: {text}");
        }
        for text in invalid {
            assert!(!pattern.matches(text.as_bytes()), "{format}: {text}");
        }
    }
    assert!(formatted("email").is_none() && formatted("uri").is_none());
    let own = reduced(json!({"type": "string", "format": "date", "pattern": "x+"}));
    let SchemaNode::PatternString { pattern, .. } = node(&own, JsonSchema::ROOT) else { panic!() };
    assert!(pattern.matches(b"xx"), "a pattern given is the one read");
    let nullable = reduced(json!({"type": ["integer", "null"], "minimum": 0}));
    let SchemaNode::AnyOf(types) = node(&nullable, JsonSchema::ROOT) else { panic!() };
    assert_eq!(node(&nullable, types[0]), &bounded(Some(0), None));
    // A pattern, with the length bounds beside it; an enum's strings are those it matches
    // whole; on another type it says nothing.
    let date = reduced(json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$", "maxLength": 7}));
    let SchemaNode::PatternString { pattern, min_length: 0, max_length: Some(7) } =
        node(&date, JsonSchema::ROOT)
    else {
        panic!("{date:?}")
    };
    assert!(pattern.matches(b"2026-11") && !pattern.matches(b"2026-1"));
    let matching = reduced(json!({"type": "string", "enum": ["ab", "xab", "b"], "pattern": "a?b"}));
    assert_eq!(matching.nodes, [SchemaNode::Literals(vec!["\"ab\"".into(), "\"b\"".into()])]);
    let int = reduced(json!({"type": "integer", "pattern": "x"}));
    assert_eq!(int.nodes, [SchemaNode::Number { integer: true }]);
    let at_least = reduced(json!({"type": "string", "minLength": 2, "maxLength": 1 << 20}));
    let want = SchemaNode::BoundedString { min_length: 2, max_length: None };
    assert_eq!(node(&at_least, JsonSchema::ROOT), &want);
    assert!(schema.is_well_formed());
}

#[test]
fn maps_free_values_and_keys_are_read_as_json_writes_them() {
    let any = reduced(json!({}));
    assert_eq!(any.nodes, [SchemaNode::Any]);
    assert_eq!(reduced(json!(true)).nodes, [SchemaNode::Any]);
    let map = reduced(json!({"type": "object", "additionalProperties": {"type": "number"}}));
    let SchemaNode::Map { values } = node(&map, JsonSchema::ROOT) else { panic!() };
    assert_eq!(node(&map, *values), &SchemaNode::Number { integer: false });
    let free = reduced(json!({"type": "object"}));
    let SchemaNode::Map { values } = node(&free, JsonSchema::ROOT) else { panic!() };
    assert_eq!(node(&free, *values), &SchemaNode::Any);
    let empty = reduced(json!({"type": "object", "additionalProperties": false}));
    assert_eq!(node(&empty, JsonSchema::ROOT), &SchemaNode::Object { properties: vec![] });
    // A key with a quote and a non-ASCII character, as serde_json writes it.
    let keyed = reduced(json!({"properties": {"a\"b é": {"const": {"x": [1, "y"]}}}}));
    let SchemaNode::Object { properties } = node(&keyed, JsonSchema::ROOT) else { panic!() };
    assert_eq!(properties[0].key, "\"a\\\"b é\"");
    assert_eq!(
        node(&keyed, properties[0].value),
        &SchemaNode::Literals(vec![r#"{"x":[1,"y"]}"#.into()])
    );
}

#[test]
fn references_within_the_document_resolve_recursive_ones_included() {
    // As pydantic writes a model that holds a list of itself and one of another model.
    let schema = reduced(json!({
        "$defs": {
            "Leaf": {"properties": {"v": {"type": "integer"}}, "required": ["v"], "type": "object"},
            "Node": {
                "properties": {
                    "children": {"items": {"$ref": "#/$defs/Node"}, "type": "array"},
                    "leaf": {"anyOf": [{"$ref": "#/$defs/Leaf"}, {"type": "null"}], "default": null}
                },
                "required": ["children"], "type": "object"
            }
        },
        "$ref": "#/$defs/Node"
    }));
    assert!(schema.is_well_formed());
    let SchemaNode::Object { properties } = node(&schema, JsonSchema::ROOT) else {
        panic!("{:?}", schema.nodes)
    };
    let SchemaNode::Array { items, .. } = node(&schema, properties[0].value) else { panic!() };
    assert_eq!(node(&schema, *items), node(&schema, JsonSchema::ROOT), "the list holds nodes");
    let SchemaNode::AnyOf(leaf) = node(&schema, properties[1].value) else { panic!() };
    assert!(matches!(node(&schema, leaf[0]), SchemaNode::Object { .. }));
    // `definitions` and the root itself.
    let list =
        reduced(json!({"type": "array", "items": {"anyOf": [{"$ref": "#"}, {"type": "integer"}]}}));
    assert!(list.is_well_formed());
    let old = reduced(json!({"definitions": {"A": {"type": "string"}}, "$ref": "#/definitions/A"}));
    assert_eq!(node(&old, JsonSchema::ROOT), &SchemaNode::String);
}

#[test]
fn constraints_the_reader_cannot_keep_are_refused_naming_the_keyword_and_where() {
    for (schema, keyword, at) in [
        (json!({"properties": {"d": {"pattern": "^a"}}}), "pattern", "#/properties/d"),
        (json!({"$ref": "#", "pattern": "a"}), "pattern", "#"),
        (json!({"type": "number", "maximum": 3e20}), "maximum", "#"),
        (json!({"properties": {"n": {"minimum": 0}}}), "minimum", "#/properties/n"),
        (json!({"maxLength": 3}), "maxLength", "#"),
        (json!({"anyOf": [{"type": "integer"}], "maximum": 3}), "maximum", "#"),
        (json!({"$ref": "#", "minLength": 1}), "minLength", "#"),
        (json!({"type": "integer", "exclusiveMinimum": true}), "exclusiveMinimum", "#"),
        (json!({"type": "string", "minLength": 70000}), "minLength", "#"),
        (json!({"type": "number", "exclusiveMinimum": false}), "exclusiveMinimum", "#"),
        (json!({"items": {"multipleOf": 2}}), "multipleOf", "#/items"),
        (json!({"type": "array", "uniqueItems": true}), "uniqueItems", "#"),
        (json!({"anyOf": [{"type": "string"}, {"not": {}}]}), "not", "#/anyOf/1"),
        (json!({"allOf": [{"type": "string"}, {"type": "integer"}]}), "allOf", "#/allOf"),
        (json!({"type": "object", "anyOf": [{}]}), "type", "#"),
        (json!({"$ref": "#/$defs/A", "type": "string", "$defs": {"A": {}}}), "type", "#"),
        (json!({"$ref": "https://example.com/s.json"}), "$ref", "#"),
        (json!({"type": "array", "items": [{}, {}]}), "items", "#"),
        (
            json!({"prefixItems": [{"type": "array", "uniqueItems": true}]}),
            "uniqueItems",
            "#/prefixItems/0",
        ),
        (json!({"$ref": "#", "prefixItems": []}), "prefixItems", "#"),
        (json!({"required": ["a"], "properties": {}}), "\"a\"", "#"),
    ] {
        let (code, message) = refusal(schema.clone());
        assert_eq!(code, "unsupported_parameter", "{schema}: {message}");
        assert!(message.contains(keyword) && message.contains(&format!("(at {at})")), "{message}");
    }
    for (schema, what) in [
        (json!(false), "false"),
        (json!(3), "an object or a boolean"),
        (json!({"type": "date"}), "unknown type"),
        (json!({"enum": []}), "non-empty"),
        (json!({"enum": [1, 2], "type": "string"}), "no value"),
        (json!({"type": "array", "minItems": 3, "maxItems": 2}), "maxItems"),
        (json!({"type": "array", "minItems": -1}), "minItems"),
        (json!({"type": "string", "minLength": 2, "maxLength": 1}), "maxLength"),
        (json!({"type": "integer", "minimum": 5, "maximum": 4.5}), "no integer"),
        (json!({"type": "number", "minimum": 0.5, "exclusiveMaximum": 0.5}), "no number"),
        (json!({"prefixItems": [{}], "items": false, "minItems": 2}), "no array"),
        (json!({"type": "array", "prefixItems": {}}), "\"prefixItems\" is a list"),
        (json!({"type": "number", "exclusiveMinimum": 2, "maximum": 1.5}), "no number"),
        (json!({"$ref": "#/$defs/missing"}), "names nothing"),
        (json!({"$defs": {"A": {"$ref": "#/$defs/A"}}, "$ref": "#/$defs/A"}), "only itself"),
        (json!({"anyOf": []}), "non-empty"),
        (json!({"type": "string", "pattern": "(a"}), "unclosed group"),
        (json!({"type": "string", "pattern": "a(?=b)"}), "look-around"),
        (json!({"type": "string", "pattern": 5}), "\"pattern\" is a string"),
        (json!({"enum": ["ab", "b"], "pattern": "a+"}), "no value"),
    ] {
        let (code, message) = refusal(schema.clone());
        assert_eq!(code, "invalid_value", "{schema}: {message}");
        assert!(message.contains(what), "{schema}: {message}");
    }
}

#[test]
fn an_enum_past_the_readers_counts_is_refused() {
    let values: Vec<u32> = (0..70_000).collect();
    let (code, message) = refusal(json!({"enum": values}));
    assert_eq!(code, "unsupported_parameter");
    assert!(message.contains("65535"), "{message}");
    let long_key = "k".repeat(70_000);
    let (code, _) = refusal(json!({"properties": {long_key: {}}}));
    assert_eq!(code, "unsupported_parameter");
}
