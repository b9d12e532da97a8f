//! `POST /tokenize` and `POST /detokenize`, as vLLM's OpenAI server serves them.
//!
//! `/tokenize` takes a `prompt` (special tokens added by default) or chat `messages` rendered
//! with the checkpoint's template (no extra special tokens by default, since the template writes
//! them) and answers `{count, max_model_len, tokens, token_strs}`; `/detokenize` takes `tokens`
//! and answers `{prompt}`, special tokens kept.

use actix_web::{HttpResponse, web};
use routed_types::TokenId;
use serde_json::{Value, json};

use crate::AppState;
use crate::body::{JsonBody, prepare};
use crate::error::ApiError;
use crate::validate::{ChatExtras, ChatRender, check_model, encode, render_messages, token_ids};
use crate::wire::{DetokenizeBody, TokenizeBody, parse};

/// The token ids of a `/tokenize` body and the field they came from.
fn tokenize_ids(
    state: &AppState,
    b: &TokenizeBody,
) -> Result<(Vec<TokenId>, &'static str), ApiError> {
    let (text, param, add_special) = match (&b.prompt, &b.messages) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("messages", "give either prompt or messages, not both"));
        }
        (Some(Value::String(prompt)), None) => {
            (prompt.clone(), "prompt", b.add_special_tokens.unwrap_or(true))
        }
        (Some(_), None) => return Err(ApiError::invalid("prompt", "prompt must be a string")),
        (None, Some(messages)) => {
            refuse_chat_options(b)?;
            let how = ChatRender::new(b.add_generation_prompt, b.continue_final_message)?;
            let extras = ChatExtras::new(b.tools.as_deref(), b.chat_template_kwargs.as_ref())?;
            (
                render_messages(state, messages, how, extras)?,
                "messages",
                b.add_special_tokens.unwrap_or(false),
            )
        }
        (None, None) => {
            return Err(ApiError::missing("prompt", "'prompt' (or chat 'messages') is required"));
        }
    };
    let ids = encode(state, &text, add_special, param, state.info().max_model_len)?;
    Ok((ids, param))
}

/// Chat options this server does not offer on `/tokenize`, refused unless neutral (a request's
/// own template is refused by vLLM too unless the server trusts it).
fn refuse_chat_options(b: &TokenizeBody) -> Result<(), ApiError> {
    if b.chat_template.is_some() {
        return Err(ApiError::unsupported(
            "chat_template",
            "a request's own chat_template is not accepted; the checkpoint's template is used",
        ));
    }
    Ok(())
}

/// `POST /tokenize` (prepared off the I/O threads: encoding is the expensive part).
pub(crate) async fn tokenize(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let answer = prepare(&state, body, tokenize_answer).await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// The answer of `/tokenize`.
fn tokenize_answer(state: &AppState, body: &Value) -> Result<Value, ApiError> {
    let b: TokenizeBody = parse(body)?;
    let info = state.info();
    check_model(info, b.model.as_deref())?;
    let (ids, param) = tokenize_ids(state, &b)?;
    if ids.len() > info.max_model_len {
        return Err(ApiError::invalid(
            param,
            format!(
                "this model's maximum context length is {} tokens, and the {param} has {}",
                info.max_model_len,
                ids.len()
            ),
        ));
    }
    let token_strs = b.return_token_strs.unwrap_or(false).then(|| {
        let tokenizer = state.tokenizer();
        ids.iter().map(|&id| tokenizer.id_to_token(id).unwrap_or_default()).collect::<Vec<_>>()
    });
    Ok(json!({
        "count": ids.len(),
        "max_model_len": info.max_model_len,
        "tokens": ids,
        "token_strs": token_strs,
    }))
}

/// `POST /detokenize` (prepared off the I/O threads: decoding a large body is work too).
pub(crate) async fn detokenize(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let answer = prepare(&state, body, detokenize_answer).await?;
    Ok(HttpResponse::Ok().json(answer))
}

/// The answer of `/detokenize`.
fn detokenize_answer(state: &AppState, body: &Value) -> Result<Value, ApiError> {
    let b: DetokenizeBody = parse(body)?;
    check_model(state.info(), b.model.as_deref())?;
    let vocab_size = state.info().vocab_size;
    let ids = token_ids(&b.tokens, "tokens")?;
    if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(ApiError::invalid(
            "tokens",
            format!("token ids must be in [0, {vocab_size}), got {id}"),
        ));
    }
    let prompt = state
        .tokenizer()
        .decode_with(&ids, false)
        .map_err(|e| ApiError::invalid("tokens", format!("cannot detokenize: {e}")))?;
    Ok(json!({"prompt": prompt}))
}
