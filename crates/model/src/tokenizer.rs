//! The checkpoint's tokenizer (`tokenizer.json`), chat template (`tokenizer_config.json`) and
//! end-of-sequence ids (`generation_config.json`).

use crate::error::{ModelError, Result};
use crate::token_bound::TokenBound;
use routed_types::TokenId;
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

/// One chat message as the template sees it.
#[derive(Clone, Debug, Serialize, serde::Deserialize, PartialEq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant message's tool calls: `{"id", "type": "function", "function": {"name",
    /// "arguments"}}` with the arguments as JSON (not text), as templates read them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    /// A tool message's answer to this call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The author's name (a tool message's function).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A plain message: `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// What a chat is rendered with besides its messages.
#[derive(Clone, Copy, Debug, Default)]
pub struct ChatTemplateArgs<'a> {
    /// Append the template's assistant header.
    pub add_generation_prompt: bool,
    /// The tools the model may call (`tools` in the template; undefined when empty), as the
    /// request lists them.
    pub tools: &'a [Value],
    /// Further variables for the template (a request's `chat_template_kwargs`, such as
    /// `enable_thinking`).
    pub kwargs: Option<&'a serde_json::Map<String, Value>>,
}

impl ChatTemplateArgs<'_> {
    /// The variables the renderer sets itself, which `kwargs` may not name.
    pub const RESERVED: [&'static str; 5] =
        ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"];
}

/// Text <-> token ids, the chat template and the EOS ids of one checkpoint.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_token_ids: Vec<TokenId>,
    /// How many tokens a text needs at least, when the pipeline allows a bound.
    bound: Option<TokenBound>,
}

impl Tokenizer {
    /// Loads the tokenizer files from a checkpoint directory. `tokenizer.json` is required;
    /// `tokenizer_config.json` and `generation_config.json` are optional.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let bytes =
            std::fs::read(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let config = read_optional_json(&dir.join("tokenizer_config.json"))?;
        let generation = read_optional_json(&dir.join("generation_config.json"))?;
        let token_str = |v: &Value, key: &str| match v.get(key) {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).map(str::to_owned),
            _ => None,
        };
        let chat_template =
            config.as_ref().and_then(|c| c.get("chat_template")).and_then(Value::as_str);
        let eos_token = config.as_ref().and_then(|c| token_str(c, "eos_token"));
        let mut eos_token_ids =
            generation.as_ref().map(|g| ids_of(g.get("eos_token_id"))).unwrap_or_default();
        if eos_token_ids.is_empty()
            && let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t))
        {
            eos_token_ids.push(id);
        }
        Ok(Self {
            bound: TokenBound::of(&inner),
            chat_template: chat_template.map(str::to_owned),
            bos_token: config.as_ref().and_then(|c| token_str(c, "bos_token")),
            eos_token,
            eos_token_ids,
            inner,
        })
    }

    /// Encodes text without adding special tokens (prompts arrive already templated).
    pub fn encode(&self, text: &str) -> Result<Vec<TokenId>> {
        self.encode_with(text, false)
    }

    /// How many tokens `text` encodes to at least (without special tokens), computed without
    /// encoding it: linear in the text's length, and just its length for ASCII. A caller with a
    /// token limit refuses a text whose bound already exceeds it before paying for the encoding
    /// (seconds and gigabytes for a text of tens of MiB). 0 for a tokenizer whose pipeline may
    /// delete text (see `token_bound.rs` for the argument and the pipelines that qualify).
    pub fn min_tokens(&self, text: &str) -> usize {
        self.bound.as_ref().map_or(0, |b| b.min_tokens(text))
    }

    /// The most bytes of (normalised) text one token stands for, when [`Self::min_tokens`] has a
    /// bound.
    pub fn max_bytes_per_token(&self) -> Option<usize> {
        self.bound.as_ref().map(TokenBound::max_bytes_per_token)
    }

    /// Decodes ids to text, skipping special tokens.
    pub fn decode(&self, ids: &[TokenId]) -> Result<String> {
        self.decode_with(ids, true)
    }

    /// Encodes text, adding the special tokens the tokenizer's post-processor defines (a BOS, for
    /// example) when `add_special_tokens` is set, as transformers' `encode` does.
    pub fn encode_with(&self, text: &str, add_special_tokens: bool) -> Result<Vec<TokenId>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text; `skip_special_tokens: false` keeps them, as transformers' `decode`
    /// does by default.
    pub fn decode_with(&self, ids: &[TokenId], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer(e.to_string()))
    }

    /// The vocabulary entry of `id` (transformers' `convert_ids_to_tokens`), `None` outside the
    /// vocabulary.
    pub fn id_to_token(&self, id: TokenId) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Every token's bytes as it decodes them (`None` for special tokens), indexed by id: what
    /// an output constraint reads the vocabulary as.
    pub fn token_bytes(&self) -> Vec<Option<Vec<u8>>> {
        crate::token_bytes::vocabulary_bytes(&self.inner)
    }

    /// The id of the one token whose entry is `text` (an added token's content, or a vocabulary
    /// entry as the model spells it), if there is one.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.inner.token_to_id(text)
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Ids that end generation (unless a request ignores EOS).
    pub fn eos_token_ids(&self) -> &[TokenId] {
        &self.eos_token_ids
    }

    /// Whether the checkpoint ships a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.chat_template.is_some()
    }

    /// Renders `messages` with the checkpoint's chat template, as transformers'
    /// `apply_chat_template(..., tokenize=False)` does.
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let args = ChatTemplateArgs { add_generation_prompt, ..ChatTemplateArgs::default() };
        self.apply_chat_template_with(messages, args)
    }

    /// [`Tokenizer::apply_chat_template`] with tools and further variables, as transformers'
    /// `apply_chat_template(messages, tools=..., **kwargs)` renders them.
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        args: ChatTemplateArgs<'_>,
    ) -> Result<String> {
        let source = self
            .chat_template
            .as_deref()
            .ok_or_else(|| ModelError::ChatTemplate("this model has no chat template".into()))?;
        let mut env = minijinja::Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| ModelError::ChatTemplate(e.to_string()))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template("chat", source).map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        let template =
            env.get_template("chat").map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => minijinja::value::Serde(messages),
                tools => (!args.tools.is_empty()).then_some(minijinja::value::Serde(args.tools)),
                add_generation_prompt => args.add_generation_prompt,
                bos_token => self.bos_token.clone().unwrap_or_default(),
                eos_token => self.eos_token.clone().unwrap_or_default(),
                ..minijinja::Value::from(minijinja::value::Serde(args.kwargs))
            })
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))
    }
}

/// The JSON in `path`, or `None` when there is no such file.
pub(crate) fn read_optional_json(path: &Path) -> Result<Option<Value>> {
    match std::fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|source| ModelError::Json { path: path.to_owned(), source }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ModelError::Io { path: path.to_owned(), source }),
    }
}

fn ids_of(v: Option<&Value>) -> Vec<TokenId> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as TokenId]).unwrap_or_default(),
        Some(Value::Array(a)) => {
            a.iter().filter_map(|x| x.as_u64().map(|n| n as TokenId)).collect()
        }
        _ => Vec::new(),
    }
}
