//! A JSON schema reduced to the shape it gives a value: what an output constraint reads
//! (`response_format: {"type": "json_schema"}`). The HTTP gateway reduces a client's schema to
//! this (refusing the keywords whose constraint it cannot keep), and the scheduler's reader
//! follows it byte by byte.

use crate::Regex;
use std::sync::Arc;

/// A node of a [`JsonSchema`], by index.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct SchemaNodeId(pub u32);

impl SchemaNodeId {
    /// The node's index in [`JsonSchema::nodes`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A reduced JSON schema: a graph of nodes, so that a schema may refer to itself (`$ref`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct JsonSchema {
    /// Every node; the value's own is [`JsonSchema::ROOT`].
    pub nodes: Vec<SchemaNode>,
}

impl JsonSchema {
    /// The node of the whole value.
    pub const ROOT: SchemaNodeId = SchemaNodeId(0);

    /// The schema whose one value is one of `choices`, as written (no quotes added).
    pub fn of_choices(choices: &[String]) -> Self {
        Self { nodes: vec![SchemaNode::Literals(choices.to_vec())] }
    }

    /// The node `id` names.
    pub fn node(&self, id: SchemaNodeId) -> &SchemaNode {
        &self.nodes[id.index()]
    }

    /// Most literals of a node, properties of an object, and bytes of a literal or a key.
    pub const MAX_ITEMS: usize = u16::MAX as usize;

    /// Whether every reference names a node, every literal is non-empty, every bound is in
    /// order and nothing exceeds [`JsonSchema::MAX_ITEMS`]: what a reader of the schema may rely
    /// on.
    pub fn is_well_formed(&self) -> bool {
        let known = |id: &SchemaNodeId| id.index() < self.nodes.len();
        let fits = |text: &String| !text.is_empty() && text.len() <= Self::MAX_ITEMS;
        !self.nodes.is_empty()
            && self.nodes.iter().all(|node| match node {
                SchemaNode::Any | SchemaNode::String | SchemaNode::Number { .. } => true,
                SchemaNode::Literals(texts) => {
                    !texts.is_empty() && texts.len() <= Self::MAX_ITEMS && texts.iter().all(fits)
                }
                SchemaNode::Array { prefix_items, items, min_items, max_items } => {
                    known(items)
                        && prefix_items.len() <= Self::MAX_ITEMS
                        && prefix_items.iter().all(known)
                        && max_items.is_none_or(|max| *min_items <= max)
                }
                SchemaNode::BoundedString { min_length, max_length }
                | SchemaNode::PatternString { min_length, max_length, .. } => {
                    max_length.is_none_or(|max| *min_length <= max)
                }
                SchemaNode::BoundedInteger { minimum: Some(lo), maximum: Some(hi) } => lo <= hi,
                SchemaNode::BoundedInteger { .. } => true,
                SchemaNode::BoundedNumber { minimum, maximum } => {
                    let fits = |b: &NumberBound| b.units.abs() <= NumberBound::MAX_UNITS;
                    minimum.iter().chain(maximum).all(fits)
                        && match (minimum, maximum) {
                            (Some(lo), Some(hi)) => NumberBound::leave_room(lo, hi),
                            _ => true,
                        }
                }
                SchemaNode::Object { properties } => {
                    properties.len() <= Self::MAX_ITEMS
                        && properties.iter().all(|p| known(&p.value) && fits(&p.key))
                }
                SchemaNode::Map { values } => known(values),
                SchemaNode::AnyOf(alternatives) => {
                    !alternatives.is_empty() && alternatives.iter().all(known)
                }
            })
    }
}

/// What a value of a schema node may be.
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum SchemaNode {
    /// Any JSON value.
    Any,
    /// Exactly one of these texts: JSON written compactly (`enum`, `const`, `boolean`, `null`),
    /// or, at the root of [`JsonSchema::of_choices`], any text.
    Literals(Vec<String>),
    /// Any string.
    String,
    /// A string of `min_length` to `max_length` characters (Unicode code points, as JSON Schema
    /// counts them; an escape is the one character it writes).
    BoundedString {
        /// Fewest characters.
        min_length: u32,
        /// Most characters, if bounded.
        max_length: Option<u32>,
    },
    /// A string whose characters (as the escapes write them) `pattern` matches whole, of
    /// `min_length` to `max_length` characters.
    PatternString {
        /// What the characters must match.
        pattern: Arc<Regex>,
        /// Fewest characters.
        min_length: u32,
        /// Most characters, if bounded.
        max_length: Option<u32>,
    },
    /// A number; with `integer`, without a fraction or an exponent.
    Number {
        /// Digits only, after an optional minus sign.
        integer: bool,
    },
    /// An integer from `minimum` to `maximum` (inclusive, either end open).
    BoundedInteger {
        /// The least, if bounded below.
        minimum: Option<i64>,
        /// The most, if bounded above.
        maximum: Option<i64>,
    },
    /// A number from `minimum` to `maximum` (either end open), written without an exponent.
    BoundedNumber {
        /// The least, if bounded below.
        minimum: Option<NumberBound>,
        /// The most, if bounded above.
        maximum: Option<NumberBound>,
    },
    /// An array of `min_items` to `max_items` items: the first ones of `prefix_items` in turn (a
    /// tuple), the rest of `items`.
    Array {
        /// The first items' nodes, one each.
        prefix_items: Vec<SchemaNodeId>,
        /// Each later item's node.
        items: SchemaNodeId,
        /// Fewest items.
        min_items: u32,
        /// Most items, if bounded.
        max_items: Option<u32>,
    },
    /// An object with these properties and no others, in this order; an optional one may be
    /// left out.
    Object {
        /// The properties, in the order they are written.
        properties: Vec<Property>,
    },
    /// An object whose keys are any strings, each with a value of `values`.
    Map {
        /// Every value's node.
        values: SchemaNodeId,
    },
    /// A value of any of these nodes.
    AnyOf(Vec<SchemaNodeId>),
}

/// An end of a [`SchemaNode::BoundedNumber`]: a decimal of at most 18 places, held exactly as a
/// count of 10^-18 units.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct NumberBound {
    /// The value in units of 10^-18.
    pub units: i128,
    /// Whether the value itself is within (`minimum`, `maximum`) or not (the exclusive ones).
    pub inclusive: bool,
}

impl NumberBound {
    /// Units in one.
    pub const ONE: i128 = 1_000_000_000_000_000_000;

    /// The largest magnitude a bound may have: 10^18.
    pub const MAX_UNITS: i128 = Self::ONE * Self::ONE;

    /// Whether some number is within `minimum` and `maximum`.
    pub fn leave_room(minimum: &Self, maximum: &Self) -> bool {
        minimum.units < maximum.units
            || (minimum.units == maximum.units && minimum.inclusive && maximum.inclusive)
    }
}

/// One property of a [`SchemaNode::Object`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Property {
    /// The key, as the JSON string it is written as (quotes and escapes included).
    pub key: String,
    /// The value's node.
    pub value: SchemaNodeId,
    /// Whether it must be there.
    pub required: bool,
}
