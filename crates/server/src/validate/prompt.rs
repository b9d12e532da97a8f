//! Prompts: token ids, text through the tokenizer, and chat messages through the template.

use routed_model::{ChatMessage, ChatTemplateArgs};
use routed_runtime::ModelInfo;
use routed_types::TokenId;
use serde_json::Value;

use crate::AppState;
use crate::error::ApiError;
use crate::wire::{ChatFields, MessageContent, WireMessage};

use super::chat::{ChatExtras, template_tool_calls};

/// Token ids from a JSON array: non-negative integers that fit a token id. Whether they are in the
/// vocabulary is the engine's rule (`routed_runtime::validate`).
pub(crate) fn token_ids(value: &[Value], param: &str) -> Result<Vec<TokenId>, ApiError> {
    value
        .iter()
        .map(|v| {
            v.as_u64().and_then(|id| TokenId::try_from(id).ok()).ok_or_else(|| {
                ApiError::invalid(
                    param,
                    format!("token ids must be non-negative integers, got {v}"),
                )
            })
        })
        .collect()
}

/// Encodes a text prompt of at most `most` tokens. A text that cannot fit is refused before it is
/// encoded, by the tokenizer's lower bound on its token count: encoding is what costs seconds and
/// gigabytes for a body of tens of MiB, and the bound is a division (see
/// `routed_model::Tokenizer::min_tokens`).
pub(crate) fn encode(
    state: &AppState,
    text: &str,
    add_special_tokens: bool,
    param: &str,
    most: usize,
) -> Result<Vec<TokenId>, ApiError> {
    let tokenizer = state.tokenizer();
    let at_least = tokenizer.min_tokens(text);
    if at_least > most {
        return Err(ApiError::invalid(
            param,
            format!(
                "this model's maximum context length is {} tokens, and the {param} text ({} \
                 bytes) encodes to at least {at_least} tokens",
                state.info().max_model_len,
                text.len()
            ),
        ));
    }
    tokenizer
        .encode_with(text, add_special_tokens)
        .map_err(|e| ApiError::invalid(param, format!("cannot tokenize: {e}")))
}

/// The most prompt tokens a generation request may have: one position stays for its output.
pub(crate) fn most_prompt_tokens(info: &ModelInfo) -> usize {
    info.max_model_len.saturating_sub(1)
}

/// vLLM's `truncate_prompt_tokens`: how many tokens of each prompt to keep, its last ones (-1:
/// `max_model_len`). `None` keeps the prompt whole.
pub(crate) fn truncation(value: Option<i64>, info: &ModelInfo) -> Result<Option<usize>, ApiError> {
    const PARAM: &str = "truncate_prompt_tokens";
    let keep = match value {
        None => return Ok(None),
        Some(-1) => info.max_model_len,
        Some(k) if k >= 1 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(ApiError::invalid(
                PARAM,
                format!("{PARAM} must be an integer >= 1 or -1, got {k}"),
            ));
        }
    };
    if keep > info.max_model_len {
        return Err(ApiError::invalid(
            PARAM,
            format!(
                "{PARAM} value ({keep}) is greater than max_model_len ({}). Please, select a \
                 smaller truncation size.",
                info.max_model_len
            ),
        ));
    }
    Ok(Some(keep))
}

/// Keeps the last `keep` tokens of `ids` (all of them when `keep` is `None`), as vLLM truncates
/// a prompt: from the left, so that what the model continues is the prompt's end. Returns
/// whether any token was dropped.
pub(crate) fn truncate(ids: &mut Vec<TokenId>, keep: Option<usize>) -> bool {
    match keep {
        Some(keep) if ids.len() > keep => {
            ids.drain(..ids.len() - keep);
            true
        }
        _ => false,
    }
}

/// The most tokens a prompt may encode to: any number when it is truncated to at most
/// `max_model_len` afterwards (the engine then checks what is kept).
fn most_encoded(info: &ModelInfo, keep: Option<usize>) -> usize {
    match keep {
        Some(_) => usize::MAX,
        None => most_prompt_tokens(info),
    }
}

/// One prompt of `/v1/completions` as it arrived: text, or token ids.
#[derive(Clone, Copy, Debug)]
pub(crate) enum PromptInput<'a> {
    /// Text, to encode.
    Text(&'a str),
    /// Token ids.
    Ids(&'a [Value]),
}

impl PromptInput<'_> {
    /// The prompt's token ids: a text encoded (see [`encode`]) with the tokenizer's own special
    /// tokens when `add_special_tokens` (a BOS, for tokenizers that add one), of any length when
    /// the prompt is to be truncated to `keep` tokens ([`truncation`]) afterwards; token ids as
    /// given.
    pub(crate) fn tokens(
        self,
        state: &AppState,
        param: &str,
        keep: Option<usize>,
        add_special_tokens: bool,
    ) -> Result<Vec<TokenId>, ApiError> {
        let most = most_encoded(state.info(), keep);
        match self {
            Self::Text(text) => encode(state, text, add_special_tokens, param, most),
            Self::Ids(ids) => token_ids(ids, param),
        }
    }

    /// The prompt's text for `echo`: the text as sent, or the decoded `ids` of a token prompt or
    /// of a truncated one (the text the model continued).
    pub(crate) fn text(
        self,
        state: &AppState,
        ids: &[TokenId],
        truncated: bool,
    ) -> Result<String, ApiError> {
        match self {
            Self::Text(text) if !truncated => Ok(text.to_owned()),
            _ => state
                .tokenizer()
                .decode(ids)
                .map_err(|e| ApiError::invalid("prompt", format!("cannot decode the prompt: {e}"))),
        }
    }
}

/// The prompts of `/v1/completions` (a string, token ids, or a batch of either), checked for
/// shape only: nothing is encoded yet, so a batch can be refused by its size first.
pub(crate) fn completion_prompts(prompt: &Value) -> Result<Vec<PromptInput<'_>>, ApiError> {
    let wrong = || {
        ApiError::invalid(
            "prompt",
            "prompt must be a string, an array of token ids, or an array of either",
        )
    };
    match prompt {
        Value::String(s) => Ok(vec![PromptInput::Text(s)]),
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            Ok(vec![PromptInput::Ids(items)])
        }
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| match item {
                Value::String(s) => Ok(PromptInput::Text(s)),
                Value::Array(ids) => Ok(PromptInput::Ids(ids)),
                _ => Err(wrong()),
            })
            .collect(),
        Value::Array(_) => Err(ApiError::invalid("prompt", "prompt must not be empty")),
        _ => Err(wrong()),
    }
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

/// The text of one message; only `text` content parts are supported, joined by newlines as
/// vLLM hands them to a template.
fn message_text(i: usize, m: &WireMessage) -> Result<String, ApiError> {
    Ok(match &m.content {
        None => String::new(),
        Some(MessageContent::Text(t)) => t.clone(),
        Some(MessageContent::Parts(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (part.kind.as_str(), &part.text) {
                    ("text", Some(t)) => {
                        if j > 0 {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
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
    extras: ChatExtras<'_>,
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
        .map(|(i, m)| {
            let tool_calls = m.tool_calls.as_deref().map(|c| template_tool_calls(i, c));
            Ok(ChatMessage {
                tool_calls: tool_calls.transpose()?,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
                ..ChatMessage::new(m.role.clone(), message_text(i, m)?)
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let args = ChatTemplateArgs {
        add_generation_prompt: how.add_generation_prompt,
        tools: extras.tools,
        kwargs: extras.kwargs,
    };
    let text = tokenizer.apply_chat_template_with(&messages, args).map_err(|e| {
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

/// What a chat with `echo` puts before each choice's content, as vLLM does: the last message's
/// text when it has the answer's role (the assistant's, or without a generation prompt the last
/// message's own), else nothing.
pub(crate) fn echoed_message(f: &ChatFields) -> Result<String, ApiError> {
    let how = ChatRender::new(f.add_generation_prompt, f.continue_final_message)?;
    let Some((last, message)) = f.messages.iter().enumerate().next_back() else {
        return Ok(String::new());
    };
    match how.add_generation_prompt && message.role != "assistant" {
        true => Ok(String::new()),
        false => message_text(last, message),
    }
}

/// Renders a chat request's messages and encodes them, keeping the last `keep` tokens when the
/// prompt is truncated ([`truncation`]). The template writes its own special tokens, so the
/// tokenizer adds its own only when the request asks (vLLM's `add_special_tokens`, false).
pub(crate) fn render_chat(
    state: &AppState,
    f: &ChatFields,
    extras: ChatExtras<'_>,
    keep: Option<usize>,
) -> Result<Vec<TokenId>, ApiError> {
    let how = ChatRender::new(f.add_generation_prompt, f.continue_final_message)?;
    let text = render_messages(state, &f.messages, how, extras)?;
    let add_special_tokens = f.add_special_tokens.unwrap_or(false);
    let most = most_encoded(state.info(), keep);
    let mut ids = encode(state, &text, add_special_tokens, "messages", most)?;
    truncate(&mut ids, keep);
    Ok(ids)
}
