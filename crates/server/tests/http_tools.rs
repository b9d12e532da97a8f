//! Chats with tools as vLLM's OpenAI server takes them: the tools, the calls of earlier turns
//! and the tool answers reach the chat template, `chat_template_kwargs` too; `tool_choice` is
//! checked against the tools and the server's parser; with `--tool-call-parser hermes` an answer
//! without calls comes back with `tool_calls: []`, whole and streamed. `tool_choice: "required"`
//! and a named function constrain the answer to calls (as vLLM does, no parser needed), which
//! come back as the message's `tool_calls`, whole and streamed. With `--tool-call-parser hermes`
//! or `mistral`, calls an answer is held to by a regex (the tiny checkpoints write none by
//! themselves) come back as `tool_calls`, and the text keeps special tokens for the parser.

mod common;

use common::{TestServer, test_config};
use routed_server::{ServerConfig, ToolCallParser};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// A template in the style of Qwen's: the tools in a system turn, an assistant turn's calls as
/// `<tool_call>` objects, a tool turn naming its call, and `enable_thinking`.
const TOOLS_TEMPLATE: &str = concat!(
    "{% if tools %}<|im_start|>system\n# Tools{% for tool in tools %}{{ '\\n' }}",
    "{{ tool.function.name }}: {{ tool.function.description }}{% endfor %}<|im_end|>\n",
    "{% endif %}{% for message in messages %}<|im_start|>{{ message.role }}\n",
    "{% if message.tool_calls %}{% for call in message.tool_calls %}",
    "<tool_call>{{ call.function.name }} {{ call.function.arguments.city }}</tool_call>",
    "{% endfor %}{% else %}{{ message.content }}{% endif %}",
    "{% if message.tool_call_id %} (answers {{ message.tool_call_id }}){% endif %}",
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n",
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}",
    "{% endif %}",
);

/// The tiny checkpoint with [`TOOLS_TEMPLATE`] as its chat template, in a directory that lives as
/// long as the test process.
fn checkpoint_with_tools_template() -> std::path::PathBuf {
    checkpoint_with_template(TOOLS_TEMPLATE)
}

/// The tiny checkpoint with `template` as its chat template, in a directory that lives as long as
/// the test process.
fn checkpoint_with_template(template: &str) -> std::path::PathBuf {
    let dir = tempfile::tempdir().expect("tempdir").keep();
    let from = common::checkpoint(MODEL);
    for entry in std::fs::read_dir(&from).expect("checkpoint") {
        let path = entry.expect("entry").path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).expect("copy");
    }
    let config_path = dir.join("tokenizer_config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["chat_template"] = json!(template);
    std::fs::write(&config_path, config.to_string()).unwrap();
    dir
}

/// A server on the tools template, reading calls with `parser`.
fn tools_server(parser: Option<ToolCallParser>) -> TestServer {
    let dir = checkpoint_with_tools_template();
    let mut config = test_config(MODEL);
    config.model = routed_runtime::ModelSource::Dir(dir);
    let server = ServerConfig { tool_call_parser: parser, ..ServerConfig::default() };
    TestServer::start_with(config, server)
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }})
}

/// A conversation with a call and its answer.
fn conversation() -> Value {
    json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{
            "id": "call-1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
        }]},
        {"role": "tool", "tool_call_id": "call-1", "name": "get_weather", "content": "sunny"},
    ])
}

/// The text `/tokenize` renders `body`'s chat to.
fn rendered(s: &TestServer, body: &Value) -> String {
    let tokens = s.ok("/tokenize", body)["tokens"].clone();
    s.ok("/detokenize", &json!({"tokens": tokens}))["prompt"].as_str().unwrap().to_owned()
}

#[test]
fn tools_calls_and_tool_answers_reach_the_template() {
    let s = tools_server(Some(ToolCallParser::Hermes));
    let body = json!({"messages": conversation(), "tools": [weather_tool()]});
    let text = rendered(&s, &body);
    let want = "<|im_start|>system\n# Tools\nget_weather: The weather in a city<|im_end|>\n\
                <|im_start|>user\nWeather in Paris?<|im_end|>\n\
                <|im_start|>assistant\n<tool_call>get_weather Paris</tool_call><|im_end|>\n\
                <|im_start|>tool\nsunny (answers call-1)<|im_end|>\n\
                <|im_start|>assistant\n";
    assert_eq!(text, want);
    // Without tools the template leaves its tools turn out; the variables reach it.
    let plain = rendered(&s, &json!({"messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(plain, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    let kwargs = json!({"messages": [{"role": "user", "content": "hi"}],
                        "chat_template_kwargs": {"enable_thinking": false}});
    assert!(rendered(&s, &kwargs).ends_with("<|im_start|>assistant\n<think></think>"));
    // The chat route renders the same prompt.
    let chat = s.ok(
        "/v1/chat/completions",
        &json!({"messages": conversation(), "tools": [weather_tool()], "max_tokens": 2,
                "return_token_ids": true}),
    );
    let tokens = s.ok("/tokenize", &body)["tokens"].clone();
    assert_eq!(chat["prompt_token_ids"], tokens);
}

#[test]
fn an_answer_without_calls_has_empty_tool_calls_whole_and_streamed() {
    let s = tools_server(Some(ToolCallParser::Hermes));
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "tools": [weather_tool()],
                      "max_tokens": 6, "temperature": 0});
    let whole = s.ok("/v1/chat/completions", &body);
    let choice = &whole["choices"][0];
    let text = choice["message"]["content"].as_str().expect("content").to_owned();
    assert!(!text.contains("<tool_call>"));
    assert_eq!(choice["message"]["tool_calls"], json!([]));
    assert_eq!(choice["finish_reason"], "length");
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let chunks = s.post("/v1/chat/completions", &stream).sse_json();
    let streamed: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, text);
    assert!(chunks.iter().all(|c| c["choices"][0]["delta"].get("tool_calls").is_none()));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    // `tool_choice: "none"` reads no calls: the message is the plain one.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    let plain = s.ok("/v1/chat/completions", &none);
    assert_eq!(plain["choices"][0]["message"]["content"], text.as_str());
    assert!(plain["choices"][0]["message"].get("tool_calls").is_none());
}

#[test]
fn tool_choice_and_tools_are_checked_as_vllm_checks_them() {
    let with = tools_server(Some(ToolCallParser::Hermes));
    let without = tools_server(None);
    let hi = json!([{"role": "user", "content": "hi"}]);
    let chat = |s: &TestServer, extra: Value| {
        let mut body = json!({"messages": hi, "max_tokens": 1});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        s.post("/v1/chat/completions", &body)
    };
    // "auto" (the default with tools) needs the parser.
    let err =
        chat(&without, json!({"tools": [weather_tool()]})).error(400, "invalid_request_error");
    assert_eq!(err["param"], "tool_choice");
    assert!(err["message"].as_str().unwrap().contains("--enable-auto-tool-choice"), "{err}");
    assert_eq!(
        chat(&without, json!({"tools": [weather_tool()], "tool_choice": "none"})).status,
        200
    );
    let unkeepable = json!({"type": "function", "function": {"name": "f", "parameters":
        {"type": "object", "properties": {"d": {"type": "integer", "multipleOf": 2}}}}});
    for (extra, param, code) in [
        (
            json!({"tools": [weather_tool()],
                   "tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
            "tool_choice",
            "invalid_value",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": {"function": {"name": "get_weather"}}}),
            "tool_choice",
            "invalid_value",
        ),
        (
            json!({"tools": [weather_tool()], "tool_choice": "required",
                   "response_format": {"type": "json_object"}}),
            "tool_choice",
            "invalid_value",
        ),
        (
            json!({"tools": [weather_tool(), unkeepable], "tool_choice": "required"}),
            "tools",
            "unsupported_parameter",
        ),
        (json!({"tool_choice": "auto"}), "tool_choice", "invalid_value"),
        (
            json!({"tools": [weather_tool()], "tool_choice": "sometimes"}),
            "tool_choice",
            "invalid_value",
        ),
        (json!({"tools": [{"type": "function"}]}), "tools[0]", "invalid_value"),
        (
            json!({"tools": [{"type": "code", "function": {"name": "f"}}]}),
            "tools[0]",
            "invalid_value",
        ),
        (
            json!({"chat_template_kwargs": {"add_generation_prompt": false}}),
            "chat_template_kwargs.add_generation_prompt",
            "invalid_value",
        ),
    ] {
        let err = chat(&with, extra.clone()).error(400, "invalid_request_error");
        assert_eq!(
            (err["param"].as_str(), err["code"].as_str()),
            (Some(param), Some(code)),
            "{extra}"
        );
    }
    // "required" with no tools to require behaves as "none", as OpenAI's does.
    assert_eq!(chat(&with, json!({"tools": [], "tool_choice": "required"})).status, 200);
    // A call of an earlier turn whose arguments are not JSON.
    let mut bad = conversation();
    bad[1]["tool_calls"][0]["function"]["arguments"] = json!("{city: Paris");
    let body = json!({"messages": bad, "tools": [weather_tool()], "max_tokens": 1});
    let err = with.post("/v1/chat/completions", &body).error(400, "invalid_request_error");
    assert_eq!(err["param"], "messages[1].tool_calls[0].function.arguments");
}

/// A second tool, with a nested object from `$defs` and an enum.
fn forecast_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_forecast",
        "parameters": {
            "type": "object",
            "properties": {
                "place": {"$ref": "#/$defs/Place"},
                "unit": {"enum": ["celsius", "fahrenheit"]}
            },
            "required": ["place", "unit"],
            "$defs": {"Place": {"type": "object", "properties": {"city": {"type": "string"}},
                                "required": ["city"]}}
        }
    }})
}

/// Whether `arguments` are whole arguments of `name`, one of the two tools.
fn fits(name: &str, arguments: &str) -> bool {
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else { return false };
    match name {
        "get_weather" => args.keys().all(|k| k == "city") && args.values().all(Value::is_string),
        "get_forecast" => {
            args.len() == 2
                && args["place"]["city"].is_string()
                && ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap_or_default())
        }
        _ => false,
    }
}

/// Streamed `tool_calls` deltas merged by index as the `openai` client merges them: the first
/// delta of a call brings its id, type and name (and perhaps a piece of its arguments), every
/// later delta a piece of its arguments.
fn accumulate(deltas: impl Iterator<Item = Value>) -> Value {
    let mut merged: Vec<Value> = Vec::new();
    for delta in deltas {
        let index = delta["index"].as_u64().expect("index") as usize;
        let piece = delta["function"]["arguments"].as_str().unwrap_or_default().to_owned();
        match merged.get_mut(index) {
            Some(call) => {
                assert!(delta.get("id").is_none(), "a call is named once: {delta}");
                let so_far = call["function"]["arguments"].as_str().unwrap_or_default();
                let args = so_far.to_owned() + &piece;
                call["function"]["arguments"] = json!(args);
            }
            None => {
                assert_eq!(index, merged.len(), "calls come in order: {delta}");
                let mut call = delta;
                call["function"]["arguments"] = json!(piece);
                merged.push(call);
            }
        }
    }
    json!(merged)
}

/// Each call's name and arguments, from a message or from a stream's accumulated deltas.
fn calls(tool_calls: &Value) -> Vec<(String, String)> {
    let list = tool_calls.as_array().expect("tool_calls");
    list.iter()
        .map(|c| {
            assert_eq!(c["type"], "function", "{c}");
            assert!(c["id"].as_str().unwrap().starts_with("chatcmpl-tool-"), "{c}");
            let f = &c["function"];
            (f["name"].as_str().unwrap().to_owned(), f["arguments"].as_str().unwrap().to_owned())
        })
        .collect()
}

#[test]
fn a_forced_tool_choice_makes_calls_of_the_tools_whole_and_streamed() {
    // No parser: as in vLLM, a forced choice needs none.
    let s = tools_server(None);
    let tools = json!([weather_tool(), forecast_tool()]);
    let named = json!({"type": "function", "function": {"name": "get_forecast"}});
    let (mut num_named, mut num_required) = (0, 0);
    for seed in 0..8 {
        for choice in [named.clone(), json!("required")] {
            let body = json!({"messages": [{"role": "user", "content": "Weather?"}],
                              "tools": tools, "tool_choice": choice, "max_tokens": 256,
                              "temperature": 1.0, "seed": seed});
            let out = s.ok("/v1/chat/completions", &body);
            let answer = &out["choices"][0];
            let (message, finish) = (&answer["message"], answer["finish_reason"].as_str().unwrap());
            let whole = match choice.is_string() {
                // Named: one call to it, arguments as written; the answer's own finish reason.
                false => {
                    assert_eq!(message["content"], "", "{answer}");
                    let made = calls(&message["tool_calls"]);
                    assert_eq!((made.len(), made[0].0.as_str()), (1, "get_forecast"), "{answer}");
                    assert!(finish == "stop" || finish == "length", "{answer}");
                    let whole = finish == "stop";
                    assert!(!whole || fits("get_forecast", &made[0].1), "{answer}");
                    num_named += usize::from(whole);
                    whole
                }
                // Required: the calls listed, finish_reason tool_calls; cut short, the text.
                true if finish == "tool_calls" => {
                    assert_eq!(message["content"], "", "{answer}");
                    let made = calls(&message["tool_calls"]);
                    assert!(!made.is_empty(), "{answer}");
                    assert!(made.iter().all(|(name, args)| fits(name, args)), "{answer}");
                    num_required += 1;
                    true
                }
                true => {
                    assert_eq!(finish, "length", "{answer}");
                    assert_eq!(message["tool_calls"], json!([]), "{answer}");
                    let text = message["content"].as_str().unwrap().trim_start();
                    assert!(text.is_empty() || text.starts_with('['), "{answer}");
                    false
                }
            };
            // Streamed: the same calls (ids aside) once the deltas are accumulated as clients
            // do (a named call's arguments arrive piece by piece), the same finish reason.
            let mut stream = body.clone();
            stream["stream"] = json!(true);
            let chunks = s.post("/v1/chat/completions", &stream).sse_json();
            let deltas: Vec<Value> = chunks
                .iter()
                .flat_map(|c| {
                    c["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default()
                })
                .collect();
            // A named call's arguments stream with the tokens.
            assert!(choice.is_string() || deltas.len() > 1, "seed {seed}: {deltas:?}");
            let last = chunks.iter().rev().find(|c| !c["choices"][0]["finish_reason"].is_null());
            assert_eq!(last.unwrap()["choices"][0]["finish_reason"], finish, "seed {seed}");
            if whole {
                let streamed = accumulate(deltas.into_iter());
                assert_eq!(calls(&streamed), calls(&message["tool_calls"]), "seed {seed}");
            }
        }
    }
    assert!(num_named > 0 && num_required > 0, "{num_named} named, {num_required} required");
}

/// The call each parser reads, and a regex that holds the model to an answer of text and that
/// call (the tiny checkpoint writes no calls by itself). The arguments are written compactly, to
/// come back with vLLM's separators.
fn a_call_as(parser: ToolCallParser) -> (&'static str, &'static str) {
    match parser {
        ToolCallParser::Hermes => (
            "Checking.",
            r#"Checking\.<tool_call>\{"name": "get_weather", "arguments": \{"city":"Paris"\}\}</tool_call>"#,
        ),
        ToolCallParser::Mistral => (
            "Checking. ",
            r#"Checking\. \[TOOL_CALLS\] \[\{"name": "get_weather", "arguments": \{"city":"Paris"\}\}\]"#,
        ),
    }
}

#[test]
fn calls_the_model_writes_are_read_by_the_servers_parser_whole_and_streamed() {
    for parser in [ToolCallParser::Hermes, ToolCallParser::Mistral] {
        let s = tools_server(Some(parser));
        let (content, pattern) = a_call_as(parser);
        let body = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                          "tools": [weather_tool()], "max_tokens": 200, "temperature": 0,
                          "structured_outputs": {"regex": pattern}});
        let whole = s.ok("/v1/chat/completions", &body);
        let choice = &whole["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{parser:?}: {whole}");
        assert_eq!(choice["message"]["content"], content, "{parser:?}");
        let made = &choice["message"]["tool_calls"];
        assert_eq!(made.as_array().map(Vec::len), Some(1), "{parser:?}: {made}");
        assert_eq!(made[0]["type"], "function");
        let function = json!({"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"});
        assert_eq!(made[0]["function"], function, "{parser:?}");
        // vLLM's ids: `chatcmpl-tool-` and 32 hex digits, Mistral's 9 letters and digits.
        let id = made[0]["id"].as_str().unwrap();
        match parser {
            ToolCallParser::Hermes => assert!(id.starts_with("chatcmpl-tool-"), "{id}"),
            ToolCallParser::Mistral => {
                assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}")
            }
        }

        let mut stream = body.clone();
        stream["stream"] = json!(true);
        let chunks = s.post("/v1/chat/completions", &stream).sse_json();
        let delta = |c: &Value| c["choices"][0]["delta"].clone();
        let streamed: String =
            chunks.iter().filter_map(|c| delta(c)["content"].as_str().map(str::to_owned)).collect();
        assert_eq!(streamed, content, "{parser:?}");
        let deltas: Vec<Value> = chunks
            .iter()
            .flat_map(|c| delta(c)["tool_calls"].as_array().cloned().unwrap_or_default())
            .collect();
        // `hermes` streams the name, then the arguments as they come (as vLLM does); `mistral`
        // the list's calls whole once it closes.
        assert_eq!(deltas[0]["function"]["name"], "get_weather");
        match parser {
            ToolCallParser::Hermes => assert!(deltas.len() > 3, "{deltas:?}"),
            ToolCallParser::Mistral => assert_eq!(deltas.len(), 1, "{deltas:?}"),
        }
        let accumulated = accumulate(deltas.into_iter());
        assert_eq!(accumulated[0]["function"], function, "{parser:?}: {accumulated}");
        assert_eq!(accumulated.as_array().map(Vec::len), Some(1));
        let last = chunks.iter().rev().find(|c| !c["choices"][0]["finish_reason"].is_null());
        assert_eq!(last.unwrap()["choices"][0]["finish_reason"], "tool_calls", "{parser:?}");

        // `tool_choice: "none"` reads none: the text as the model wrote it.
        let mut none = body.clone();
        none["tool_choice"] = json!("none");
        let plain = s.ok("/v1/chat/completions", &none);
        let text = plain["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
        assert!(text.starts_with(content) && text.ends_with(['>', ']']), "{parser:?}: {text}");
        assert_eq!(plain["choices"][0]["finish_reason"], "stop");
    }
}

/// The tools checkpoint with its last BPE token made the special token `[TOOL_CALLS]`, as it is
/// in Mistral's tokenizers (the merge that made the token is dropped, nothing else uses it).
fn checkpoint_with_a_tool_calls_token() -> (std::path::PathBuf, u64) {
    let dir = checkpoint_with_tools_template();
    let path = dir.join("tokenizer.json");
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let model = &mut tokenizer["model"];
    let last = model["merges"].as_array_mut().unwrap().pop().unwrap();
    let word: String = last.as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
    let vocab = model["vocab"].as_object_mut().unwrap();
    let id = vocab.remove(&word).unwrap();
    vocab.insert("[TOOL_CALLS]".into(), id.clone());
    tokenizer["added_tokens"].as_array_mut().unwrap().push(json!({
        "id": id, "content": "[TOOL_CALLS]", "single_word": false, "lstrip": false,
        "rstrip": false, "normalized": false, "special": true,
    }));
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    (dir, id.as_u64().unwrap())
}

#[test]
fn a_chat_that_reads_calls_keeps_special_tokens_in_its_text_as_vllm_does() {
    let (dir, id) = checkpoint_with_a_tool_calls_token();
    let mut config = test_config(MODEL);
    config.model = routed_runtime::ModelSource::Dir(dir);
    let server =
        ServerConfig { tool_call_parser: Some(ToolCallParser::Mistral), ..ServerConfig::default() };
    let s = TestServer::start_with(config, server);
    // A bias makes the model write the special token twice.
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "tools": [weather_tool()],
                      "max_tokens": 2, "temperature": 0, "logit_bias": {id.to_string(): 100},
                      "skip_special_tokens": true});
    let read = s.ok("/v1/chat/completions", &body);
    // Kept for the parser, which finds no list after it: the text is the content.
    assert_eq!(read["choices"][0]["message"]["content"], "[TOOL_CALLS][TOOL_CALLS]", "{read}");
    assert_eq!(read["choices"][0]["message"]["tool_calls"], json!([]));
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    assert_eq!(common::streamed_content(&s, &stream), "[TOOL_CALLS][TOOL_CALLS]");
    // A chat that reads no calls skips them, as asked.
    let mut none = body.clone();
    none["tool_choice"] = json!("none");
    assert_eq!(s.ok("/v1/chat/completions", &none)["choices"][0]["message"]["content"], "");
}

#[test]
fn parallel_tool_calls_false_keeps_the_first_call_whole_and_streamed_as_vllm_does() {
    let s = tools_server(Some(ToolCallParser::Hermes));
    let call = |city: &str| {
        format!(
            r#"<tool_call>\{{"name": "get_weather", "arguments": \{{"city": "{city}"\}}\}}</tool_call>"#
        )
    };
    let pattern = format!("{}{}", call("Paris"), call("Rome"));
    let body = json!({"messages": [{"role": "user", "content": "Weather?"}],
                      "tools": [weather_tool()], "max_tokens": 200, "temperature": 0,
                      "structured_outputs": {"regex": pattern}});
    let cities = |calls: &Value| -> Vec<String> {
        let list = calls.as_array().expect("tool_calls");
        list.iter().map(|c| c["function"]["arguments"].as_str().unwrap().to_owned()).collect()
    };
    let paris = "{\"city\": \"Paris\"}".to_owned();
    let rome = "{\"city\": \"Rome\"}".to_owned();
    for (parallel, want) in [(None, vec![paris.clone(), rome]), (Some(false), vec![paris])] {
        let mut body = body.clone();
        if let Some(p) = parallel {
            body["parallel_tool_calls"] = json!(p);
        }
        let whole = s.ok("/v1/chat/completions", &body);
        assert_eq!(cities(&whole["choices"][0]["message"]["tool_calls"]), want, "{whole}");
        assert_eq!(whole["choices"][0]["finish_reason"], "tool_calls");
        body["stream"] = json!(true);
        let chunks = s.post("/v1/chat/completions", &body).sse_json();
        let deltas = chunks.iter().flat_map(|c| {
            c["choices"][0]["delta"]["tool_calls"].as_array().cloned().unwrap_or_default()
        });
        assert_eq!(cities(&accumulate(deltas)), want, "{parallel:?}");
    }
}

#[test]
fn documents_and_reasoning_effort_reach_the_template_as_vllm_passes_them() {
    let template = concat!(
        "{% for d in documents %}[{{ d.title }}: {{ d.text }}]{% endfor %}",
        "{% if reasoning_effort is defined %}<{{ reasoning_effort }}>{% endif %}",
        "{% for m in messages %}{{ m.content }}{% endfor %}",
    );
    let mut config = test_config(MODEL);
    config.model = routed_runtime::ModelSource::Dir(checkpoint_with_template(template));
    let s = TestServer::start_with(config, ServerConfig::default());
    let prompt = |extra: Value| -> Result<String, Value> {
        let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
                              "return_token_ids": true, "documents": []});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let out = s.post("/v1/chat/completions", &body);
        if out.status != 200 {
            return Err(out.json()["error"].clone());
        }
        let tokens = out.json()["prompt_token_ids"].clone();
        Ok(s.ok("/detokenize", &json!({"tokens": tokens}))["prompt"].as_str().unwrap().to_owned())
    };
    let documents = json!([{"title": "A", "text": "one"}, {"title": "B", "text": "two"}]);
    assert_eq!(prompt(json!({"documents": documents})).unwrap(), "[A: one][B: two]hi");
    assert_eq!(prompt(json!({"reasoning_effort": "low"})).unwrap(), "<low>hi");
    // The request's fields are set over `chat_template_kwargs`' own.
    let both = json!({"reasoning_effort": "high",
                      "chat_template_kwargs": {"reasoning_effort": "low"}});
    assert_eq!(prompt(both).unwrap(), "<high>hi");
    for (extra, param) in [
        (json!({"documents": "text"}), "documents"),
        (json!({"documents": [{"title": 1}]}), "documents"),
        (json!({"reasoning_effort": "max"}), "reasoning_effort"),
        (json!({"chat_template": "{{ messages }}"}), "chat_template"),
    ] {
        assert_eq!(prompt(extra.clone()).unwrap_err()["param"], param, "{extra}");
    }
}
