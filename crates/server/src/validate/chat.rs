//! A chat's tools, `tool_choice`, tool messages and template variables, checked as vLLM's
//! OpenAI server checks them, every refusal a 400 naming the field.

use routed_model::ChatTemplateArgs;
use serde_json::{Map, Value, json};

use crate::AppState;
use crate::error::ApiError;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ToolChoice {
    /// No calls are read (the tools are still rendered).
    None,
    /// The model may call the tools; its calls are read from its output.
    Auto,
    /// The model must call one: needs output constrained to a call.
    Required,
    /// The model must call this function: the same.
    Named,
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
            (Some(Value::Object(_)), _) => Self::Named,
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

/// Whether the model's tool calls are read from its output: `tool_choice` checked against the
/// tools and the server's parser. `"required"` and a named function would need output
/// constrained to a call, which this server does not offer.
pub(crate) fn parses_tool_calls(
    state: &AppState,
    tool_choice: Option<&Value>,
    tools: Option<&[Value]>,
) -> Result<bool, ApiError> {
    let constrained = |what: &str| {
        ApiError::unsupported(
            "tool_choice",
            format!(
                "tool_choice {what} needs output constrained to a tool call, which this server \
                 does not offer; use \"auto\" or \"none\""
            ),
        )
    };
    match (ToolChoice::of(tool_choice, tools)?, state.tool_call_parser()) {
        (ToolChoice::None, _) => Ok(false),
        (ToolChoice::Auto, Some(_)) => Ok(true),
        (ToolChoice::Auto, None) => Err(ApiError::invalid(
            "tool_choice",
            "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to \
             be set",
        )),
        (ToolChoice::Required, _) => Err(constrained("\"required\"")),
        (ToolChoice::Named, _) => Err(constrained("naming a function")),
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
