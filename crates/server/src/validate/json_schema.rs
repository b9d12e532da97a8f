//! A client's JSON schema reduced to the shape it gives a value ([`JsonSchema`]), which the
//! engine's reader follows byte by byte.
//!
//! Kept: `type` (one or a list), `enum`, `const`, `properties` with `required` (written in the
//! schema's order, optional ones may be left out, no other keys), `additionalProperties` (an
//! object without `properties` is a map of its values), `prefixItems` (a tuple), `items`,
//! `minItems`, `maxItems`, `anyOf` and `oneOf` (read as `anyOf`), `allOf` of one schema, a
//! string's `minLength`, `maxLength` and `pattern` (matched whole: a stricter reading than JSON
//! Schema's search, so a string that matches is always valid), the `format`s a pattern spells
//! (dates, times and durations, UUIDs, IP addresses), a number's `minimum` and `maximum`
//! (exclusive too), and `$ref` within the document (`#`, `#/$defs/...`, `#/definitions/...`,
//! any JSON pointer), recursive ones included. Annotations (`title`, `description`, `default`,
//! `examples`, any other `format`, which JSON Schema makes an annotation by default, ...) change
//! nothing. A keyword whose constraint the reader cannot keep (`multipleOf`, `uniqueItems`, ...)
//! is a 400 naming it and where it stands: an output that ignored it could break the schema.

use std::collections::HashMap;
use std::sync::Arc;

use routed_types::{JsonSchema, NumberBound, Property, Regex, SchemaNode, SchemaNodeId};
use serde_json::{Map, Value};

use super::regex::compiled;
use crate::error::ApiError;
use scalar::{format_regex, grid_bound};

/// Keywords whose constraint the reader cannot keep.
const REFUSED: [&str; 14] = [
    "multipleOf",
    "patternProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "if",
    "not",
    "contains",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
];

/// Bounds of a number.
const NUMERIC: [&str; 4] = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"];

/// Bounds kept only where `type` says what they bound (a number's, a string's).
const TYPED_BOUNDS: [&str; 7] = [
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
];

/// Keywords that shape a value: a schema using one beside `$ref`, `anyOf` or `oneOf` is refused
/// rather than read as one of them alone.
const SHAPING: [&str; 20] = [
    "type",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "anyOf",
    "oneOf",
    "allOf",
];

/// Most nodes a reduced schema may have.
const MAX_NODES: usize = 4096;

/// Reduces `schema` (the value of the field `param`).
pub(crate) fn reduce(schema: &Value, param: &str) -> Result<JsonSchema, ApiError> {
    let mut reducer = Reducer { root: schema, param, nodes: Vec::new(), refs: HashMap::new() };
    reducer.node(schema, "#")?;
    let reduced = JsonSchema { nodes: reducer.nodes };
    // What is left: more than 65,535 values of an enum, properties of an object, or bytes in one
    // of them.
    if !reduced.is_well_formed() {
        let most = JsonSchema::MAX_ITEMS;
        let message = format!(
            "{param}: an enum, an object or a key of more than {most} values, properties or \
             bytes is not supported"
        );
        return Err(ApiError::unsupported(param, message));
    }
    Ok(reduced)
}

struct Reducer<'a> {
    root: &'a Value,
    param: &'a str,
    nodes: Vec<SchemaNode>,
    /// Nodes of the `$ref` targets reduced so far (or being reduced), by pointer.
    refs: HashMap<String, SchemaNodeId>,
}

impl Reducer<'_> {
    fn refuse(&self, at: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::unsupported(self.param, format!("{}: {message} (at {at})", self.param))
    }

    fn invalid(&self, at: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError::invalid(self.param, format!("{}: {message} (at {at})", self.param))
    }

    /// A new node (a placeholder, where its contents need its id first).
    fn add(&mut self, node: SchemaNode, at: &str) -> Result<SchemaNodeId, ApiError> {
        if self.nodes.len() == MAX_NODES {
            return Err(self.refuse(at, format!("a schema of more than {MAX_NODES} nodes")));
        }
        self.nodes.push(node);
        Ok(SchemaNodeId(self.nodes.len() as u32 - 1))
    }

    fn node(&mut self, schema: &Value, at: &str) -> Result<SchemaNodeId, ApiError> {
        let fields = match schema {
            Value::Bool(true) => return self.add(SchemaNode::Any, at),
            Value::Bool(false) => {
                return Err(self.invalid(at, "the schema `false` allows no value"));
            }
            Value::Object(fields) => fields,
            other => {
                return Err(
                    self.invalid(at, format!("a schema is an object or a boolean, got {other}"))
                );
            }
        };
        if let Some(keyword) = REFUSED.iter().find(|k| fields.contains_key(**k)) {
            return Err(self.refuse(at, format!("\"{keyword}\" is not supported")));
        }
        if fields.get("uniqueItems") == Some(&Value::Bool(true)) {
            return Err(self.refuse(at, "\"uniqueItems\": true is not supported"));
        }
        let shaping =
            |except: &str| SHAPING.iter().find(|k| **k != except && fields.contains_key(**k));
        if let Some(target) = fields.get("$ref") {
            if let Some(keyword) = shaping("") {
                return Err(self.refuse(at, format!("\"{keyword}\" beside \"$ref\"")));
            }
            return self.reference(target, at);
        }
        for combinator in ["anyOf", "oneOf", "allOf"] {
            let Some(list) = fields.get(combinator) else { continue };
            if let Some(keyword) = shaping(combinator) {
                return Err(self.refuse(at, format!("\"{keyword}\" beside \"{combinator}\"")));
            }
            return self.combination(combinator, list, &format!("{at}/{combinator}"));
        }
        if let Some(value) = fields.get("const") {
            return self.literals(std::slice::from_ref(value), fields, at);
        }
        if let Some(values) = fields.get("enum") {
            let Some(values) = values.as_array().filter(|v| !v.is_empty()) else {
                return Err(self.invalid(at, "\"enum\" is a non-empty list of values"));
            };
            return self.literals(values, fields, at);
        }
        match fields.get("type") {
            Some(Value::String(name)) => self.typed(name, fields, at),
            Some(Value::Array(names)) if !names.is_empty() => {
                let id = self.add(SchemaNode::Any, at)?;
                let mut alternatives = Vec::with_capacity(names.len());
                for name in names {
                    let Some(name) = name.as_str() else {
                        return Err(self.invalid(at, format!("\"type\" lists names, got {name}")));
                    };
                    alternatives.push(self.typed(name, fields, at)?);
                }
                self.nodes[id.index()] = SchemaNode::AnyOf(alternatives);
                Ok(id)
            }
            Some(other) => {
                Err(self.invalid(at, format!("\"type\" is a name or a list, got {other}")))
            }
            None if ["properties", "required", "additionalProperties"]
                .iter()
                .any(|k| fields.contains_key(*k)) =>
            {
                self.object(fields, at)
            }
            None if ["items", "prefixItems", "minItems", "maxItems"]
                .iter()
                .any(|k| fields.contains_key(*k)) =>
            {
                self.array(fields, at)
            }
            None if let Some(k) = TYPED_BOUNDS.iter().find(|k| fields.contains_key(**k)) => {
                Err(self.refuse(at, format!("\"{k}\" without a \"type\" is not supported")))
            }
            None => self.add(SchemaNode::Any, at),
        }
    }

    fn typed(
        &mut self,
        name: &str,
        fields: &Map<String, Value>,
        at: &str,
    ) -> Result<SchemaNodeId, ApiError> {
        let node = match name {
            "string" => self.string(fields, at)?,
            "integer" => self.integer(fields, at)?,
            "number" => match NUMERIC.iter().any(|k| fields.contains_key(*k)) {
                true => self.number(fields, at)?,
                false => SchemaNode::Number { integer: false },
            },
            "boolean" => SchemaNode::Literals(vec!["true".into(), "false".into()]),
            "null" => SchemaNode::Literals(vec!["null".into()]),
            "object" => return self.object(fields, at),
            "array" => return self.array(fields, at),
            other => return Err(self.invalid(at, format!("unknown type {other:?}"))),
        };
        self.add(node, at)
    }

    /// `enum` or `const`: the values, written compactly, that also have the schema's `type`.
    fn literals(
        &mut self,
        values: &[Value],
        fields: &Map<String, Value>,
        at: &str,
    ) -> Result<SchemaNodeId, ApiError> {
        let types: Option<Vec<&str>> = match fields.get("type") {
            Some(Value::String(name)) => Some(vec![name.as_str()]),
            Some(Value::Array(names)) => Some(names.iter().filter_map(Value::as_str).collect()),
            _ => None,
        };
        let pattern = self.pattern(fields, at)?;
        let texts: Vec<String> = values
            .iter()
            .filter(|v| types.as_ref().is_none_or(|types| types.iter().any(|t| has_type(v, t))))
            .filter(|v| within_bounds(v, fields, pattern.as_deref()))
            .map(Value::to_string)
            .collect();
        if texts.is_empty() {
            return Err(self.invalid(
                at,
                "no value of \"enum\" or \"const\" has the schema's \"type\" and bounds",
            ));
        }
        self.add(SchemaNode::Literals(texts), at)
    }

    fn combination(
        &mut self,
        combinator: &str,
        list: &Value,
        at: &str,
    ) -> Result<SchemaNodeId, ApiError> {
        let Some(schemas) = list.as_array().filter(|l| !l.is_empty()) else {
            return Err(
                self.invalid(at, format!("\"{combinator}\" is a non-empty list of schemas"))
            );
        };
        if combinator == "allOf" {
            return match schemas.as_slice() {
                [one] => self.node(one, &format!("{at}/0")),
                _ => Err(self.refuse(at, "\"allOf\" of more than one schema is not supported")),
            };
        }
        let id = self.add(SchemaNode::Any, at)?;
        let mut alternatives = Vec::with_capacity(schemas.len());
        for (i, schema) in schemas.iter().enumerate() {
            alternatives.push(self.node(schema, &format!("{at}/{i}"))?);
        }
        self.nodes[id.index()] = SchemaNode::AnyOf(alternatives);
        Ok(id)
    }

    /// The node of a `$ref` within the document, reduced once however often it is named.
    fn reference(&mut self, target: &Value, at: &str) -> Result<SchemaNodeId, ApiError> {
        let Some(pointer) = target.as_str().and_then(|t| t.strip_prefix('#')) else {
            return Err(self.refuse(at, format!("\"$ref\" {target} outside the schema")));
        };
        if let Some(&id) = self.refs.get(pointer) {
            return Ok(id);
        }
        let Some(schema) = self.root.pointer(pointer) else {
            return Err(self.invalid(at, format!("\"$ref\" {target} names nothing in the schema")));
        };
        // Known before it is reduced, so that a schema naming itself finds it.
        let id = self.add(SchemaNode::Any, at)?;
        self.refs.insert(pointer.to_owned(), id);
        let reduced = self.node(schema, &format!("#{pointer}"))?;
        if reduced == id {
            return Err(self.invalid(at, format!("\"$ref\" {target} names only itself")));
        }
        self.nodes[id.index()] = self.nodes[reduced.index()].clone();
        Ok(id)
    }

    fn object(&mut self, fields: &Map<String, Value>, at: &str) -> Result<SchemaNodeId, ApiError> {
        let required: Vec<&str> = match fields.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => match names.iter().map(Value::as_str).collect() {
                Some(names) => names,
                None => return Err(self.invalid(at, "\"required\" is a list of property names")),
            },
            Some(other) => {
                return Err(self.invalid(at, format!("\"required\" is a list, got {other}")));
            }
        };
        let properties = match fields.get("properties") {
            None => Map::new(),
            Some(Value::Object(properties)) => properties.clone(),
            Some(other) => {
                return Err(self.invalid(at, format!("\"properties\" is an object, got {other}")));
            }
        };
        if let Some(name) = required.iter().find(|name| !properties.contains_key(**name)) {
            return Err(
                self.refuse(at, format!("required property {name:?} is not in \"properties\""))
            );
        }
        let id = self.add(SchemaNode::Any, at)?;
        let additional = fields.get("additionalProperties");
        let node = if properties.is_empty() {
            match additional {
                None | Some(Value::Bool(true)) => {
                    SchemaNode::Map { values: self.add(SchemaNode::Any, at)? }
                }
                Some(Value::Bool(false)) => SchemaNode::Object { properties: Vec::new() },
                Some(schema) => SchemaNode::Map {
                    values: self.node(schema, &format!("{at}/additionalProperties"))?,
                },
            }
        } else {
            let mut listed = Vec::with_capacity(properties.len());
            for (name, schema) in &properties {
                let value =
                    self.node(schema, &format!("{at}/properties/{}", escape_pointer(name)))?;
                let key = Value::String(name.clone()).to_string();
                listed.push(Property { key, value, required: required.contains(&name.as_str()) });
            }
            SchemaNode::Object { properties: listed }
        };
        self.nodes[id.index()] = node;
        Ok(id)
    }

    /// An integer, bounded by `minimum`, `maximum` and their exclusive forms when given (a
    /// fractional bound rounded inward; an end beyond an i64's range is open).
    fn integer(&self, fields: &Map<String, Value>, at: &str) -> Result<SchemaNode, ApiError> {
        let bound =
            |name: &str, round: fn(f64) -> f64, shift: f64| -> Result<Option<f64>, ApiError> {
                match fields.get(name) {
                    None => Ok(None),
                    Some(Value::Number(n)) => Ok(n.as_f64().map(|x| round(x) + shift)),
                    Some(other) => Err(self
                        .refuse(at, format!("\"{name}\" {other} is not supported (a number is)"))),
                }
            };
        let lows = [bound("minimum", f64::ceil, 0.0)?, bound("exclusiveMinimum", f64::floor, 1.0)?];
        let highs =
            [bound("maximum", f64::floor, 0.0)?, bound("exclusiveMaximum", f64::ceil, -1.0)?];
        let lo = lows.into_iter().flatten().reduce(f64::max);
        let hi = highs.into_iter().flatten().reduce(f64::min);
        if let (Some(lo), Some(hi)) = (lo, hi)
            && lo > hi
        {
            return Err(self.invalid(at, "no integer is within \"minimum\" and \"maximum\""));
        }
        // Past an i64's range an end is open; a range wholly past it is not supported.
        let (min, max) = (i64::MIN as f64, i64::MAX as f64);
        if lo.is_some_and(|lo| lo > max) || hi.is_some_and(|hi| hi < min) {
            return Err(self.refuse(at, "integer bounds beyond 64 bits are not supported"));
        }
        let minimum = lo.filter(|&lo| lo > min).map(|lo| lo as i64);
        let maximum = hi.filter(|&hi| hi < max).map(|hi| hi as i64);
        Ok(match (minimum, maximum) {
            (None, None) => SchemaNode::Number { integer: true },
            _ => SchemaNode::BoundedInteger { minimum, maximum },
        })
    }

    /// A number, bounded by `minimum`, `maximum` and their exclusive forms (each on the grid of
    /// 18 places that [`NumberBound`] holds: a bound with more places is rounded inward and then
    /// held, so every number read is within the schema's bounds).
    fn number(&self, fields: &Map<String, Value>, at: &str) -> Result<SchemaNode, ApiError> {
        let bound = |name: &str, lower: bool, inclusive: bool| match fields.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => grid_bound(n, lower, inclusive).map(Some).ok_or_else(|| {
                self.refuse(at, format!("\"{name}\" beyond 10^18 in size is not supported"))
            }),
            Some(other) => {
                Err(self.refuse(at, format!("\"{name}\" {other} is not supported (a number is)")))
            }
        };
        let lows = [bound("minimum", true, true)?, bound("exclusiveMinimum", true, false)?];
        let highs = [bound("maximum", false, true)?, bound("exclusiveMaximum", false, false)?];
        // The tighter end of each side; of two at one value, the exclusive one.
        let minimum = lows.into_iter().flatten().max_by_key(|b| (b.units, !b.inclusive));
        let maximum = highs.into_iter().flatten().min_by_key(|b| (b.units, b.inclusive));
        if let (Some(lo), Some(hi)) = (minimum, maximum)
            && !NumberBound::leave_room(&lo, &hi)
        {
            return Err(self.invalid(at, "no number is within \"minimum\" and \"maximum\""));
        }
        Ok(SchemaNode::BoundedNumber { minimum, maximum })
    }

    /// A string, bounded by `minLength` and `maxLength` when either is given, matching
    /// `pattern` whole when it is.
    fn string(&self, fields: &Map<String, Value>, at: &str) -> Result<SchemaNode, ApiError> {
        let pattern = match self.pattern(fields, at)? {
            Some(pattern) => Some(pattern),
            None => format_regex(fields),
        };
        if pattern.is_none()
            && !fields.contains_key("minLength")
            && !fields.contains_key("maxLength")
        {
            return Ok(SchemaNode::String);
        }
        let (min_length, max_length) = self.bounds(fields, ["minLength", "maxLength"], at)?;
        // The reader counts characters up to 65,535: past that a string is long enough.
        let most = u32::from(u16::MAX);
        if min_length > most {
            return Err(self.refuse(at, format!("\"minLength\" above {most} is not supported")));
        }
        let max_length = max_length.filter(|&max| max <= most);
        Ok(match pattern {
            Some(pattern) => SchemaNode::PatternString { pattern, min_length, max_length },
            None => SchemaNode::BoundedString { min_length, max_length },
        })
    }

    /// A string's `pattern`, compiled, if it has one.
    fn pattern(
        &self,
        fields: &Map<String, Value>,
        at: &str,
    ) -> Result<Option<Arc<Regex>>, ApiError> {
        match fields.get("pattern") {
            None => Ok(None),
            Some(Value::String(pattern)) => match compiled(pattern) {
                Ok(regex) => Ok(Some(regex)),
                Err(e) => Err(self.invalid(at, format!("\"pattern\" {pattern:?}: {e}"))),
            },
            Some(other) => Err(self.invalid(at, format!("\"pattern\" is a string, got {other}"))),
        }
    }

    /// A pair of count bounds (`minItems` and `maxItems`, say): the least (0 when absent) and
    /// the most, checked in order.
    fn bounds(
        &self,
        fields: &Map<String, Value>,
        [min, max]: [&'static str; 2],
        at: &str,
    ) -> Result<(u32, Option<u32>), ApiError> {
        let bound = |name: &'static str| match fields.get(name) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n.min(u64::from(u32::MAX)) as u32)).ok_or(name),
        };
        let (least, most) = match (bound(min), bound(max)) {
            (Ok(least), Ok(most)) => (least.unwrap_or(0), most),
            (Err(name), _) | (_, Err(name)) => {
                return Err(self.invalid(at, format!("\"{name}\" is a count (an integer >= 0)")));
            }
        };
        if most.is_some_and(|most| most < least) {
            return Err(self.invalid(at, format!("\"{max}\" is below \"{min}\": no value fits")));
        }
        Ok((least, most))
    }

    fn array(&mut self, fields: &Map<String, Value>, at: &str) -> Result<SchemaNodeId, ApiError> {
        let (min_items, mut max_items) = self.bounds(fields, ["minItems", "maxItems"], at)?;
        let id = self.add(SchemaNode::Any, at)?;
        let prefix_items = match fields.get("prefixItems") {
            None => Vec::new(),
            Some(Value::Array(schemas)) if schemas.len() <= JsonSchema::MAX_ITEMS => {
                (schemas.iter().enumerate())
                    .map(|(i, schema)| self.node(schema, &format!("{at}/prefixItems/{i}")))
                    .collect::<Result<_, _>>()?
            }
            Some(_) => {
                let why = format!(
                    "\"prefixItems\" is a list of at most {} schemas",
                    JsonSchema::MAX_ITEMS
                );
                return Err(self.invalid(at, why));
            }
        };
        let items = match fields.get("items") {
            None | Some(Value::Bool(true)) => self.add(SchemaNode::Any, at)?,
            // No item past the tuple's.
            Some(Value::Bool(false)) => {
                let num_prefix = prefix_items.len() as u32;
                max_items = Some(max_items.map_or(num_prefix, |max| max.min(num_prefix)));
                self.add(SchemaNode::Any, at)?
            }
            Some(Value::Array(_)) => {
                let why = "\"items\" as a list is not supported (\"prefixItems\" is)";
                return Err(self.refuse(at, why));
            }
            Some(schema) => self.node(schema, &format!("{at}/items"))?,
        };
        if max_items.is_some_and(|max| max < min_items) {
            return Err(self.invalid(at, "no array is within \"minItems\" and the items allowed"));
        }
        self.nodes[id.index()] = SchemaNode::Array { prefix_items, items, min_items, max_items };
        Ok(id)
    }
}

/// Whether `value` has the JSON Schema type `name`.
fn has_type(value: &Value, name: &str) -> bool {
    match (name, value) {
        ("integer", Value::Number(n)) => n.is_i64() || n.is_u64(),
        ("number", Value::Number(_))
        | ("string", Value::String(_))
        | ("boolean", Value::Bool(_))
        | ("null", Value::Null)
        | ("object", Value::Object(_))
        | ("array", Value::Array(_)) => true,
        _ => false,
    }
}

/// Whether `value` is within the schema's bounds for its kind: a number's `minimum`, `maximum`
/// and exclusive ones, a string's `minLength` and `maxLength` in characters and its `pattern`.
fn within_bounds(value: &Value, fields: &Map<String, Value>, pattern: Option<&Regex>) -> bool {
    let bound = |name: &str| fields.get(name).and_then(Value::as_f64);
    match value {
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            bound("minimum").is_none_or(|b| x >= b)
                && bound("maximum").is_none_or(|b| x <= b)
                && bound("exclusiveMinimum").is_none_or(|b| x > b)
                && bound("exclusiveMaximum").is_none_or(|b| x < b)
        }
        Value::String(text) => {
            let len = text.chars().count() as f64;
            bound("minLength").is_none_or(|b| len >= b)
                && bound("maxLength").is_none_or(|b| len <= b)
                && pattern.is_none_or(|p| p.matches(text.as_bytes()))
        }
        _ => true,
    }
}

/// A property name as a JSON pointer's segment (for messages).
fn escape_pointer(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

mod scalar;
#[cfg(test)]
mod tests;
