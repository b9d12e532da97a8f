//! Prompts: token ids, text through the tokenizer, and chat messages through the template.

use routed_model::ChatMessage;
use routed_runtime::ModelInfo;
use routed_types::TokenId;
use serde_json::Value;

use crate::AppState;
use crate::error::ApiError;
use crate::wire::{ChatFields, MessageContent, WireMessage};

/// Token ids from a JSON array, each below the vocabulary size.
pub(crate) fn token_ids(
    value: &[Value],
    info: &ModelInfo,
    param: &str,
) -> Result<Vec<TokenId>, ApiError> {
    value
        .iter()
        .map(|v| {
            v.as_u64().filter(|&id| id < info.vocab_size as u64).map(|id| id as TokenId).ok_or_else(
                || {
                    ApiError::invalid(
                        param,
                        format!("token ids must be integers in [0, {}), got {v}", info.vocab_size),
                    )
                },
            )
        })
        .collect()
}

/// Encodes a text prompt.
pub(crate) fn encode(state: &AppState, text: &str, param: &str) -> Result<Vec<TokenId>, ApiError> {
    state
        .tokenizer()
        .encode(text)
        .map_err(|e| ApiError::invalid(param, format!("cannot tokenize: {e}")))
}

/// The prompts of `/v1/completions`: a string, token ids, or a batch of either.
pub(crate) fn completion_prompts(
    state: &AppState,
    prompt: &Value,
) -> Result<Vec<Vec<TokenId>>, ApiError> {
    let info = state.info();
    let wrong = || {
        ApiError::invalid(
            "prompt",
            "prompt must be a string, an array of token ids, or an array of either",
        )
    };
    let prompts = match prompt {
        Value::String(s) => vec![encode(state, s, "prompt")?],
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            vec![token_ids(items, info, "prompt")?]
        }
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| match item {
                Value::String(s) => encode(state, s, "prompt"),
                Value::Array(ids) => token_ids(ids, info, "prompt"),
                _ => Err(wrong()),
            })
            .collect::<Result<_, _>>()?,
        Value::Array(_) => return Err(ApiError::invalid("prompt", "prompt must not be empty")),
        _ => return Err(wrong()),
    };
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid("prompt", "a prompt must have at least one token"));
    }
    Ok(prompts)
}

/// How chat messages are rendered, as transformers' `apply_chat_template` takes it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChatRender {
    /// Append the template's assistant header.
    pub add_generation_prompt: bool,
    /// Leave the final message open, for the model to continue it.
    pub continue_final_message: bool,
}

impl ChatRender {
    /// The two options, refused together as vLLM does.
    pub(crate) fn new(
        add_generation_prompt: Option<bool>,
        continue_final_message: Option<bool>,
    ) -> Result<Self, ApiError> {
        let continue_final_message = continue_final_message.unwrap_or(false);
        let add_generation_prompt = add_generation_prompt.unwrap_or(!continue_final_message);
        if add_generation_prompt && continue_final_message {
            return Err(ApiError::invalid(
                "continue_final_message",
                "continue_final_message and add_generation_prompt cannot both be true",
            ));
        }
        Ok(Self { add_generation_prompt, continue_final_message })
    }
}

/// The text of one message; only `text` content parts are supported.
fn message_text(i: usize, m: &WireMessage) -> Result<String, ApiError> {
    Ok(match &m.content {
        None => String::new(),
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::unsupported(
                            &format!("messages[{i}].content"),
                            format!("content parts of type '{}' are not supported", part.kind),
                        ));
                    }
                }
            }
            text
        }
    })
}

/// Renders chat messages with the checkpoint's template to the prompt text.
pub(crate) fn render_messages(
    state: &AppState,
    messages: &[WireMessage],
    how: ChatRender,
) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let tokenizer = state.tokenizer();
    if !tokenizer.has_chat_template() {
        return Err(ApiError::invalid(
            "messages",
            "this model has no chat template; use /v1/completions with a prompt",
        ));
    }
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| Ok(ChatMessage { role: m.role.clone(), content: message_text(i, m)? }))
        .collect::<Result<Vec<_>, ApiError>>()?;
    let text =
        tokenizer.apply_chat_template(&messages, how.add_generation_prompt).map_err(|e| {
            ApiError::invalid("messages", format!("cannot apply the chat template: {e}"))
        })?;
    if !how.continue_final_message {
        return Ok(text);
    }
    // As transformers does: cut the rendering right after the final message's content, so the
    // template's end-of-turn tokens do not close it.
    let last = messages.last().map(|m| m.content.as_str()).unwrap_or_default();
    let needle = if text.contains(last) { last } else { last.trim() };
    match text.rfind(needle).filter(|_| !needle.is_empty()) {
        Some(at) => Ok(text[..at + needle.len()].to_owned()),
        None => Err(ApiError::invalid(
            "continue_final_message",
            "the final message is empty or does not appear in the rendered chat, so it cannot \
             be continued",
        )),
    }
}

/// Renders a chat request's messages and encodes them.
pub(crate) fn render_chat(state: &AppState, f: &ChatFields) -> Result<Vec<TokenId>, ApiError> {
    let how = ChatRender::new(f.add_generation_prompt, f.continue_final_message)?;
    let text = render_messages(state, &f.messages, how)?;
    let ids = encode(state, &text, "messages")?;
    if ids.is_empty() {
        return Err(ApiError::invalid("messages", "the rendered prompt has no tokens"));
    }
    Ok(ids)
}
