//! A chat's tools, `tool_choice`, tool messages and template variables, checked as vLLM's
//! OpenAI server checks them, every refusal a 400 naming the field.

use routed_model::ChatTemplateArgs;
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::error::ApiError;
use crate::tools::ToolUse;
use crate::wire::ChatFields;

/// What a chat renders besides its messages: its tools and its template variables, checked.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ChatExtras<'a> {
    /// The tools the template lists (OpenAI's `{"type": "function", "function": {...}}`).
    pub tools: &'a [Value],
    /// `chat_template_kwargs`.
    pub kwargs: Option<&'a Map<String, Value>>,
}

impl<'a> ChatExtras<'a> {
    /// Checks `tools` (each a function with a name) and `kwargs` (none of the names the renderer
    /// sets itself).
    pub(crate) fn new(
        tools: Option<&'a [Value]>,
        kwargs: Option<&'a Map<String, Value>>,
    ) -> Result<Self, ApiError> {
        let tools = tools.unwrap_or_default();
        for (i, tool) in tools.iter().enumerate() {
            let is_function = tool.get("type").and_then(Value::as_str) == Some("function");
            let name = tool.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
            if !is_function || name.is_none() {
                return Err(ApiError::invalid(
                    &format!("tools[{i}]"),
                    "a tool is {\"type\": \"function\", \"function\": {\"name\": ..., ...}}",
                ));
            }
        }
        if let Some(reserved) = kwargs
            .into_iter()
            .flat_map(Map::keys)
            .find(|k| ChatTemplateArgs::RESERVED.contains(&k.as_str()))
        {
            return Err(ApiError::invalid(
                &format!("chat_template_kwargs.{reserved}"),
                format!(
                    "'{reserved}' is set by the request's own fields, not by a template variable"
                ),
            ));
        }
        Ok(Self { tools, kwargs })
    }
}

/// What `tool_choice` asks of the model, once checked against the tools.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ToolChoice {
    /// No calls are read (the tools are still rendered).
    None,
    /// The model may call the tools; its calls are read from its output.
    Auto,
    /// The model must call one or more of the tools.
    Required,
    /// The model must call this function.
    Named(String),
}

impl ToolChoice {
    /// `tool_choice` (`"auto"` by default when there are tools) checked as vLLM checks it.
    fn of(tool_choice: Option<&Value>, tools: Option<&[Value]>) -> Result<Self, ApiError> {
        Ok(match (tool_choice, tools) {
            (None, Some(tools)) if !tools.is_empty() => Self::Auto,
            (None, _) => Self::None,
            (Some(Value::String(s)), _) if s == "none" => Self::None,
            (Some(_), None) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "When using `tool_choice`, `tools` must be set.",
                ));
            }
            // As OpenAI: with no tools there is nothing to require.
            (Some(Value::String(s)), Some([])) if s == "required" => Self::None,
            (Some(Value::String(s)), _) if s == "required" => Self::Required,
            (Some(Value::String(s)), _) if s == "auto" => Self::Auto,
            (Some(named @ Value::Object(_)), Some(tools)) => Self::Named(named_tool(named, tools)?),
            (Some(other), _) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "Invalid value for `tool_choice`: {other}! Only named tools, \"none\", \
                         \"auto\" or \"required\" are supported."
                    ),
                ));
            }
        })
    }
}

/// The function a named `tool_choice` (`{"type": "function", "function": {"name": ...}}`)
/// names, which must be among `tools`.
fn named_tool(choice: &Value, tools: &[Value]) -> Result<String, ApiError> {
    let name = choice
        .get("function")
        .and_then(|f| f.get("name"))
        .and_then(Value::as_str)
        .filter(|_| choice.get("type").and_then(Value::as_str) == Some("function"));
    let Some(name) = name else {
        return Err(ApiError::invalid(
            "tool_choice",
            "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}",
        ));
    };
    if !tools.iter().any(|t| function(t)["name"] == name) {
        return Err(ApiError::invalid(
            "tool_choice",
            format!("Tool '{name}' has not been passed in `tools`."),
        ));
    }
    Ok(name.to_owned())
}

/// A tool's `function` object (checked present by [`ChatExtras::new`]).
fn function(tool: &Value) -> &Value {
    &tool["function"]
}

/// A function's `parameters` as a schema: an object of any keys when it has none, as vLLM
/// takes it.
fn parameters(function: &Value) -> Value {
    match function.get("parameters") {
        Some(Value::Object(p)) if !p.is_empty() => Value::Object(p.clone()),
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// The schema of a required choice's answer, as vLLM builds it: a non-empty list of
/// `{"name": <a tool's name>, "parameters": <its parameters>}`, the tools' `$defs` gathered at
/// the top so that their references resolve.
fn required_schema(tools: &[Value]) -> Result<Value, ApiError> {
    let mut defs = Map::new();
    let mut alternatives = Vec::with_capacity(tools.len());
    for tool in tools {
        let function = function(tool);
        let parameters = parameters(function);
        for (name, schema) in
            parameters.get("$defs").and_then(Value::as_object).into_iter().flatten()
        {
            if defs.get(name).is_some_and(|kept| kept != schema) {
                return Err(ApiError::invalid(
                    "tools",
                    format!(
                        "Tool definition '{name}' has multiple schemas, which is not supported."
                    ),
                ));
            }
            defs.insert(name.clone(), schema.clone());
        }
        alternatives.push(json!({
            "properties": {
                "name": {"type": "string", "enum": [function["name"]]},
                "parameters": parameters
            },
            "required": ["name", "parameters"]
        }));
    }
    let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": alternatives}});
    if !defs.is_empty() {
        schema["$defs"] = Value::Object(defs);
    }
    Ok(schema)
}

/// The template's further variables: `chat_template_kwargs`, with vLLM's `documents` (a list of
/// objects of strings) and `reasoning_effort` (`low`, `medium` or `high`) set over them when
/// given, as vLLM passes them.
pub(crate) fn template_kwargs(f: &ChatFields) -> Result<Option<Map<String, Value>>, ApiError> {
    let documents = f.documents.as_ref().filter(|d| !d.is_null());
    if let Some(documents) = documents {
        let is_document =
            |d: &Value| d.as_object().is_some_and(|d| d.values().all(Value::is_string));
        if !documents.as_array().is_some_and(|list| list.iter().all(is_document)) {
            return Err(ApiError::invalid(
                "documents",
                "documents is a list of objects whose values are strings",
            ));
        }
    }
    let effort = f.reasoning_effort.as_ref().filter(|e| !e.is_null());
    if let Some(effort) = effort
        && !matches!(effort.as_str(), Some("low" | "medium" | "high"))
    {
        return Err(ApiError::invalid(
            "reasoning_effort",
            "reasoning_effort is \"low\", \"medium\" or \"high\"",
        ));
    }
    let mut kwargs = f.chat_template_kwargs.clone();
    for (name, value) in [("documents", documents), ("reasoning_effort", effort)] {
        if let Some(value) = value {
            kwargs.get_or_insert_default().insert(name.into(), value.clone());
        }
    }
    Ok(kwargs)
}

/// How the model's tool calls come out of its answer, with the schema that constrains the answer
/// when `tool_choice` forces calls (`"required"` or a named function, as vLLM constrains them;
/// no tool parser needed). `"auto"` needs the server's parser.
pub(crate) fn tool_use(
    state: &AppState,
    tool_choice: Option<&Value>,
    tools: Option<&[Value]>,
) -> Result<(ToolUse, Option<Value>), ApiError> {
    let tools_listed = tools.unwrap_or_default();
    match (ToolChoice::of(tool_choice, tools)?, state.tool_call_parser()) {
        (ToolChoice::None, _) => Ok((ToolUse::None, None)),
        (ToolChoice::Auto, Some(parser)) => Ok((ToolUse::Parsed(parser), None)),
        (ToolChoice::Auto, None) => Err(ApiError::invalid(
            "tool_choice",
            "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to \
             be set",
        )),
        (ToolChoice::Required, _) => Ok((ToolUse::Required, Some(required_schema(tools_listed)?))),
        (ToolChoice::Named(name), _) => {
            let tool = tools_listed.iter().find(|t| function(t)["name"] == name.as_str());
            let schema = parameters(tool.map(function).unwrap_or(&Value::Null));
            Ok((ToolUse::Named(name), Some(schema)))
        }
    }
}

/// An assistant message's `tool_calls` as the template reads them: each call's `arguments` as
/// JSON (the wire sends them as JSON text), as vLLM hands them to transformers' templates.
pub(crate) fn template_tool_calls(i: usize, calls: &[Value]) -> Result<Vec<Value>, ApiError> {
    calls
        .iter()
        .enumerate()
        .map(|(j, call)| {
            let param = format!("messages[{i}].tool_calls[{j}]");
            let function = call.get("function").filter(|f| f.is_object()).ok_or_else(|| {
                ApiError::invalid(
                    &param,
                    "a tool call is {\"function\": {\"name\", \"arguments\"}}",
                )
            })?;
            let name = function.get("name").and_then(Value::as_str).ok_or_else(|| {
                ApiError::invalid(&format!("{param}.function.name"), "the name must be a string")
            })?;
            let arguments = match function.get("arguments") {
                None | Some(Value::Null) => json!({}),
                Some(Value::String(text)) => serde_json::from_str(text).map_err(|e| {
                    ApiError::invalid(
                        &format!("{param}.function.arguments"),
                        format!("the arguments are not JSON: {e}"),
                    )
                })?,
                Some(object) => object.clone(),
            };
            let mut out = json!({
                "type": call.get("type").cloned().unwrap_or_else(|| json!("function")),
                "function": {"name": name, "arguments": arguments},
            });
            if let Some(id) = call.get("id") {
                out["id"] = id.clone();
            }
            Ok(out)
        })
        .collect()
}
