//! Giving memory back between rollout steps, for a trainer colocated on the same device:
//! SGLang's `GET|POST /release_memory_occupation` and `/resume_memory_occupation` (`{"tags":
//! [...]}`), and vLLM's `POST /sleep?level=`, `POST /wake_up?tags=` and `GET /is_sleeping`.

use actix_web::{HttpResponse, web};
use routed_runtime::MemoryTags;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::wire::parse;

/// The body of SGLang's memory routes (`ReleaseMemoryOccupationReqInput` and its resume twin).
#[derive(Debug, Deserialize)]
struct TagsBody {
    tags: Option<Vec<String>>,
}

/// The tags named, every one when none is (as SGLang reads an absent or empty list). An unknown
/// name is a 400 naming `tags`.
fn tags<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<MemoryTags, ApiError> {
    let mut tags = MemoryTags::default();
    for name in names {
        let tag = MemoryTags::from_name(name).ok_or_else(|| {
            ApiError::invalid(
                "tags",
                format!(
                    "unknown tag {name:?}: expected \"weights\", \"kv_cache\" or \"cuda_graph\""
                ),
            )
        })?;
        tags = tags.union(tag);
    }
    Ok(if tags.is_empty() { MemoryTags::ALL } else { tags })
}

fn sglang_tags(body: &Value) -> Result<MemoryTags, ApiError> {
    let b: TagsBody = parse(body)?;
    tags(b.tags.iter().flatten().map(String::as_str))
}

/// SGLang's release (`release`) or resume of the memory of the body's tags, answering what it did
/// (SGLang's clients read the status).
async fn occupation(
    state: web::Data<AppState>,
    body: JsonBody,
    release: bool,
) -> Result<HttpResponse, ApiError> {
    let tags = sglang_tags(&body.value_or_empty()?)?;
    let handle = state.handle();
    let (change, message) = match release {
        true => (handle.release_memory(tags).await?, "Memory released."),
        false => (handle.resume_memory(tags).await?, "Memory resumed."),
    };
    Ok(HttpResponse::Ok().json(json!({
        "success": true,
        "message": message,
        "released": change.released.names(),
        "num_bytes": change.num_bytes,
    })))
}

/// `GET|POST /release_memory_occupation`: gives back the memory of `tags` (every kind when none
/// is named). Refused with a 400 while requests are running.
pub(crate) async fn release_memory_occupation(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    occupation(state, body, true).await
}

/// `GET|POST /resume_memory_occupation`: takes the memory of `tags` again.
pub(crate) async fn resume_memory_occupation(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    occupation(state, body, false).await
}

/// vLLM's `POST /sleep?level=1|2`: both levels give back the weights and the KV cache (level 1
/// keeps no host copy here: the weights are read from the checkpoint again on wake-up). 200 with
/// an empty body, as vLLM answers.
pub(crate) async fn sleep(
    state: web::Data<AppState>,
    query: web::Query<Vec<(String, String)>>,
) -> Result<HttpResponse, ApiError> {
    let level = query.iter().find(|(k, _)| k == "level").map_or("1", |(_, v)| v.as_str());
    if !matches!(level, "1" | "2") {
        return Err(ApiError::invalid("level", format!("level {level:?}: expected 1 or 2")));
    }
    state.handle().release_memory(MemoryTags::ALL).await?;
    Ok(HttpResponse::Ok().finish())
}

/// vLLM's `POST /wake_up?tags=weights&tags=kv_cache`: takes the memory of the tags named (every
/// kind when none is). 200 with an empty body.
pub(crate) async fn wake_up(
    state: web::Data<AppState>,
    query: web::Query<Vec<(String, String)>>,
) -> Result<HttpResponse, ApiError> {
    let names = query.iter().filter(|(k, _)| k == "tags").map(|(_, v)| v.as_str());
    state.handle().resume_memory(tags(names)?).await?;
    Ok(HttpResponse::Ok().finish())
}

/// vLLM's `GET /is_sleeping`: whether the weights or the KV cache are given back.
pub(crate) async fn is_sleeping(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let released = state.handle().memory_released().await?;
    Ok(HttpResponse::Ok().json(json!({"is_sleeping": released.stops_steps()})))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_read_as_sglang_reads_them() {
        assert_eq!(tags([]).unwrap(), MemoryTags::ALL, "none named: all");
        let weights = tags(["weights"]).unwrap();
        assert_eq!(weights, MemoryTags { weights: true, ..MemoryTags::default() });
        let both = tags(["kv_cache", "cuda_graph"]).unwrap();
        assert_eq!(both.names(), ["kv_cache", "cuda_graph"]);
        let e = tags(["weights", "optimizer"]).unwrap_err();
        assert_eq!(e.body().error.param.as_deref(), Some("tags"));
        assert_eq!(sglang_tags(&json!({"tags": null})).unwrap(), MemoryTags::ALL);
        assert_eq!(sglang_tags(&json!({"tags": []})).unwrap(), MemoryTags::ALL);
        assert!(sglang_tags(&json!({"tags": "weights"})).is_err(), "a list, not a string");
    }
}
