//! The fixture's tools, resources and prompts, as the conformance suite's scenario
//! descriptions define them (`conformance list --server`, then each scenario's "Server
//! Implementation Requirements").
//!
//! SEP-2322 multi round-trip requests are stateless: round one answers an
//! `InputRequiredResult`, the client retries with `inputResponses` (and the echoed
//! `requestState`), and the answer depends only on that retry. Every `requestState` is sealed
//! with HMAC-SHA256 ([`RequestStateCodec`]) under a key drawn at start-up, bound to the tool
//! name, so a tampered or transplanted state is rejected with -32602.

use std::sync::Arc;
use std::time::Duration;

use rand::RngCore;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities,
    CompleteRequestParams, CompleteResult, CompletionInfo, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, InputRequests, InputRequiredResult,
    InputResponses, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, Prompt, PromptArgument,
    PromptMessage, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Reference,
    RequestStateCodec, RequestStateError, Resource, ResourceContents, ResourceTemplate, Role,
    SealOptions, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};

/// 1x1 red PNG.
const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==";
/// An empty 44.1 kHz mono 16-bit WAV.
const WAV: &str = "UklGRiQAAABXQVZFZm10IBAAAAABAAEARKwAAIhYAQACABAAZGF0YQAAAAA=";

/// How long list and read results may be cached (SEP-2549 `ttlMs`).
const TTL_MS: u64 = 60_000;

/// The fixture server; clones share the `requestState` key.
#[derive(Clone)]
pub(crate) struct Fixture {
    codec: Arc<RequestStateCodec>,
}

impl Fixture {
    /// A fixture with a fresh random `requestState` key (`rand`'s OS-seeded CSPRNG).
    pub(crate) fn new() -> Result<Self, RequestStateError> {
        let mut key = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut key);
        Ok(Self {
            codec: Arc::new(RequestStateCodec::try_new(key.to_vec())?),
        })
    }

    fn seal(&self, tool: &str, step: &str) -> String {
        self.codec.seal_with(
            step.as_bytes(),
            &SealOptions::new()
                .associated_data(tool.as_bytes())
                .ttl(Duration::from_secs(600)),
        )
    }

    /// The step sealed in `state` for `tool`, or -32602 if it was forged, tampered with or
    /// issued for another tool.
    fn open(&self, tool: &str, state: &str) -> Result<String, ErrorData> {
        let step = self
            .codec
            .open_with(state, tool.as_bytes())
            .map_err(|err| {
                ErrorData::invalid_params(
                    format!("requestState failed its integrity check: {err}"),
                    None,
                )
            })?;
        String::from_utf8(step)
            .map_err(|_| ErrorData::invalid_params("requestState is not valid", None))
    }
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn no_args() -> Map<String, Value> {
    object(json!({ "type": "object", "properties": {} }))
}

fn tools() -> Vec<Tool> {
    let simple = [
        ("test_simple_text", "Returns one text block"),
        ("test_image_content", "Returns one PNG image block"),
        ("test_audio_content", "Returns one WAV audio block"),
        (
            "test_embedded_resource",
            "Returns one embedded text resource",
        ),
        (
            "test_multiple_content_types",
            "Returns text, image and resource blocks",
        ),
        ("test_error_handling", "Always fails with isError: true"),
        (
            "test_tool_with_progress",
            "Reports progress 0, 50 and 100 of 100",
        ),
        ("test_logging_tool", "Answers without logging"),
        (
            "test_missing_capability",
            "Needs the client's sampling capability",
        ),
        (
            "test_streaming_elicitation",
            "Asks for input through an InputRequiredResult",
        ),
        (
            "test_input_required_result_elicitation",
            "SEP-2322: one elicitation round",
        ),
        (
            "test_input_required_result_sampling",
            "SEP-2322: one sampling round",
        ),
        (
            "test_input_required_result_list_roots",
            "SEP-2322: one roots/list round",
        ),
        (
            "test_input_required_result_request_state",
            "SEP-2322: round trip of requestState",
        ),
        (
            "test_input_required_result_multiple_inputs",
            "SEP-2322: three input requests at once",
        ),
        (
            "test_input_required_result_multi_round",
            "SEP-2322: two rounds of input",
        ),
        (
            "test_input_required_result_tampered_state",
            "SEP-2322: rejects a tampered requestState",
        ),
        (
            "test_input_required_result_capabilities",
            "SEP-2322: asks only for declared capabilities",
        ),
    ];
    let mut tools: Vec<Tool> = simple
        .iter()
        .map(|(name, description)| Tool::new(*name, *description, no_args()))
        .collect();
    tools.push(Tool::new(
        "json_schema_2020_12_tool",
        "Input schema with JSON Schema 2020-12 keywords",
        object(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "address": {
                    "$anchor": "addressDef",
                    "type": "object",
                    "properties": { "street": { "type": "string" }, "city": { "type": "string" } }
                }
            },
            "properties": {
                "name": { "type": "string" },
                "address": { "$ref": "#/$defs/address" },
                "contactMethod": { "type": "string", "enum": ["phone", "email"] },
                "phone": { "type": "string" },
                "email": { "type": "string" }
            },
            "allOf": [{ "anyOf": [{ "required": ["phone"] }, { "required": ["email"] }] }],
            "if": { "properties": { "contactMethod": { "const": "phone" } }, "required": ["contactMethod"] },
            "then": { "required": ["phone"] },
            "else": { "required": ["email"] },
            "additionalProperties": false
        })),
    ));
    tools
}

fn text(text: impl Into<String>) -> CallToolResponse {
    CallToolResult::success(vec![ContentBlock::text(text)]).into()
}

/// Builds the `inputRequests` map from `(key, method, params)` triples.
fn input_requests(requests: &[(&str, &str, Value)]) -> Result<InputRequests, ErrorData> {
    let map: Map<String, Value> = requests
        .iter()
        .map(|(key, method, params)| {
            (
                (*key).to_owned(),
                json!({ "method": method, "params": params }),
            )
        })
        .collect();
    serde_json::from_value(Value::Object(map))
        .map_err(|err| ErrorData::internal_error(format!("bad input request: {err}"), None))
}

fn elicit(message: &str, field: &str, kind: &str) -> Value {
    json!({
        "mode": "form",
        "message": message,
        "requestedSchema": {
            "type": "object",
            "properties": { field: { "type": kind } },
            "required": [field]
        }
    })
}

fn sample(prompt: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [{ "role": "user", "content": { "type": "text", "text": prompt } }],
        "maxTokens": max_tokens
    })
}

fn input_required(
    requests: &[(&str, &str, Value)],
    state: Option<String>,
) -> Result<InputRequiredResult, ErrorData> {
    Ok(InputRequiredResult::new(
        Some(input_requests(requests)?),
        state,
    ))
}

/// What the client answered to one input request.
enum Answer<'a> {
    /// No answer under that key: ask again.
    Missing,
    /// The answer is present and has the expected shape.
    Valid(&'a Value),
}

/// Looks up the answer to `key`; a present answer that is not an object is invalid input
/// (-32602).
fn answer<'a>(responses: Option<&'a InputResponses>, key: &str) -> Result<Answer<'a>, ErrorData> {
    match responses.and_then(|responses| responses.get(key)) {
        None => Ok(Answer::Missing),
        Some(value) if value.is_object() => Ok(Answer::Valid(value)),
        Some(_) => Err(ErrorData::invalid_params(
            format!("inputResponses.{key} must be an object"),
            Some(json!({ "key": key })),
        )),
    }
}

/// The accepted elicitation's `content[field]` as a string; -32602 if the answer is not an
/// accepted elicitation carrying it.
fn elicited(value: &Value, field: &str) -> Result<String, ErrorData> {
    let action = value.get("action").and_then(Value::as_str);
    let content = value.get("content").and_then(|content| content.get(field));
    match (action, content) {
        (Some("accept"), Some(Value::String(text))) => Ok(text.clone()),
        (Some("accept"), Some(other)) => Ok(other.to_string()),
        (Some("decline" | "cancel"), _) => Ok(String::from("(declined)")),
        _ => Err(ErrorData::invalid_params(
            format!("expected an ElicitResult with content.{field}"),
            None,
        )),
    }
}

fn sampled(value: &Value) -> Result<String, ErrorData> {
    value
        .get("content")
        .and_then(|content| content.get("text"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| ErrorData::invalid_params("expected a CreateMessageResult with text", None))
}

fn roots(value: &Value) -> Result<Vec<String>, ErrorData> {
    let roots = value
        .get("roots")
        .and_then(Value::as_array)
        .ok_or_else(|| ErrorData::invalid_params("expected a ListRootsResult", None))?;
    Ok(roots
        .iter()
        .filter_map(|root| root.get("uri").and_then(Value::as_str))
        .map(str::to_owned)
        .collect())
}

impl Fixture {
    async fn call(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let responses = request.input_responses.as_ref();
        let state = request.request_state.as_deref();
        let name = request.name.as_ref();
        match name {
            "test_simple_text" => Ok(text("This is a simple text response for testing.")),
            "test_image_content" => {
                Ok(CallToolResult::success(vec![ContentBlock::image(PNG, "image/png")]).into())
            }
            "test_audio_content" => {
                Ok(CallToolResult::success(vec![ContentBlock::audio(WAV, "audio/wav")]).into())
            }
            "test_embedded_resource" => Ok(CallToolResult::success(vec![ContentBlock::resource(
                ResourceContents::text(
                    "This is an embedded resource content.",
                    "test://embedded-resource",
                )
                .with_mime_type("text/plain"),
            )])
            .into()),
            "test_multiple_content_types" => Ok(CallToolResult::success(vec![
                ContentBlock::text("Multiple content types test:"),
                ContentBlock::image(PNG, "image/png"),
                ContentBlock::resource(
                    ResourceContents::text(
                        r#"{"test":"data","value":123}"#,
                        "test://mixed-content-resource",
                    )
                    .with_mime_type("application/json"),
                ),
            ])
            .into()),
            "test_error_handling" => Ok(CallToolResult::error(vec![ContentBlock::text(
                "This tool intentionally returns an error for testing",
            )])
            .into()),
            "test_tool_with_progress" => {
                let token = cx.meta.get_progress_token();
                for (step, progress) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if step > 0 {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    if let Some(token) = &token {
                        let notification = ProgressNotificationParam::new(token.clone(), progress)
                            .with_total(100.0);
                        if let Err(err) = cx.peer.notify_progress(notification).await {
                            tracing::warn!(%err, "cannot send a progress notification");
                        }
                    }
                }
                Ok(text("Progress test completed"))
            }
            // Logs nothing: the request sets no log level (SEP-2577 deprecates logging).
            "test_logging_tool" => Ok(text("Logging test completed")),
            "test_missing_capability" => {
                let declared = cx
                    .meta
                    .client_capabilities()
                    .is_some_and(|caps| caps.sampling.is_some());
                if !declared {
                    let sampling: ClientCapabilities =
                        serde_json::from_value(json!({ "sampling": {} }))
                            .map_err(|err| ErrorData::internal_error(err.to_string(), None))?;
                    return Err(ErrorData::missing_required_client_capability(sampling));
                }
                sampling(responses)
            }
            "test_streaming_elicitation" | "test_input_required_result_elicitation" => {
                match answer(responses, "user_name")? {
                    Answer::Valid(value) => {
                        Ok(text(format!("Hello, {}!", elicited(value, "name")?)))
                    }
                    Answer::Missing => Ok(input_required(
                        &[(
                            "user_name",
                            "elicitation/create",
                            elicit("What is your name?", "name", "string"),
                        )],
                        None,
                    )?
                    .into()),
                }
            }
            "test_input_required_result_sampling" => sampling(responses),
            "test_input_required_result_list_roots" => match answer(responses, "client_roots")? {
                Answer::Valid(value) => Ok(text(format!("Roots: {}", roots(value)?.join(", ")))),
                Answer::Missing => {
                    Ok(input_required(&[("client_roots", "roots/list", json!({}))], None)?.into())
                }
            },
            "test_input_required_result_request_state"
            | "test_input_required_result_tampered_state" => {
                let ask = || -> Result<CallToolResponse, ErrorData> {
                    Ok(input_required(
                        &[(
                            "confirm",
                            "elicitation/create",
                            elicit("Please confirm", "ok", "boolean"),
                        )],
                        Some(self.seal(name, "confirm")),
                    )?
                    .into())
                };
                let Some(state) = state else {
                    return ask();
                };
                let step = self.open(name, state)?;
                match (step.as_str(), answer(responses, "confirm")?) {
                    ("confirm", Answer::Valid(value)) => Ok(text(format!(
                        "state-ok: confirmed={}",
                        elicited(value, "ok")?
                    ))),
                    _ => ask(),
                }
            }
            "test_input_required_result_multiple_inputs" => {
                let ask = || -> Result<CallToolResponse, ErrorData> {
                    Ok(input_required(
                        &[
                            (
                                "user_name",
                                "elicitation/create",
                                elicit("What is your name?", "name", "string"),
                            ),
                            (
                                "greeting",
                                "sampling/createMessage",
                                sample("Generate a greeting", 50),
                            ),
                            ("client_roots", "roots/list", json!({})),
                        ],
                        Some(self.seal(name, "all")),
                    )?
                    .into())
                };
                let Some(state) = state else {
                    return ask();
                };
                self.open(name, state)?;
                match (
                    answer(responses, "user_name")?,
                    answer(responses, "greeting")?,
                    answer(responses, "client_roots")?,
                ) {
                    (Answer::Valid(user), Answer::Valid(greeting), Answer::Valid(client_roots)) => {
                        Ok(text(format!(
                            "name={}; greeting={}; roots={}",
                            elicited(user, "name")?,
                            sampled(greeting)?,
                            roots(client_roots)?.join(", ")
                        )))
                    }
                    _ => ask(),
                }
            }
            "test_input_required_result_multi_round" => {
                let step1 = || -> Result<CallToolResponse, ErrorData> {
                    Ok(input_required(
                        &[(
                            "step1",
                            "elicitation/create",
                            elicit("Step 1: What is your name?", "name", "string"),
                        )],
                        Some(self.seal(name, "step1")),
                    )?
                    .into())
                };
                let Some(state) = state else {
                    return step1();
                };
                let step = self.open(name, state)?;
                if step == "step1" {
                    return match answer(responses, "step1")? {
                        Answer::Valid(value) => {
                            let person = elicited(value, "name")?;
                            let next = serde_json::to_string(&json!({ "name": person }))
                                .map_err(|err| ErrorData::internal_error(err.to_string(), None))?;
                            Ok(input_required(
                                &[(
                                    "step2",
                                    "elicitation/create",
                                    elicit(
                                        "Step 2: What is your favorite color?",
                                        "color",
                                        "string",
                                    ),
                                )],
                                Some(self.seal(name, &next)),
                            )?
                            .into())
                        }
                        Answer::Missing => step1(),
                    };
                }
                let person = serde_json::from_str::<Value>(&step)
                    .ok()
                    .and_then(|step| step.get("name").and_then(Value::as_str).map(str::to_owned))
                    .ok_or_else(|| ErrorData::invalid_params("requestState is not valid", None))?;
                match answer(responses, "step2")? {
                    Answer::Valid(value) => Ok(text(format!(
                        "{person} likes {}",
                        elicited(value, "color")?
                    ))),
                    Answer::Missing => Ok(input_required(
                        &[(
                            "step2",
                            "elicitation/create",
                            elicit("Step 2: What is your favorite color?", "color", "string"),
                        )],
                        Some(state.to_owned()),
                    )?
                    .into()),
                }
            }
            "test_input_required_result_capabilities" => {
                let caps = cx.meta.client_capabilities().unwrap_or_default();
                if let Some(responses) = responses.filter(|responses| !responses.is_empty()) {
                    let keys: Vec<&str> = responses.keys().map(String::as_str).collect();
                    return Ok(text(format!("answered: {}", keys.join(", "))));
                }
                let mut requests = Vec::new();
                if caps.elicitation.is_some() {
                    requests.push((
                        "user_name",
                        "elicitation/create",
                        elicit("What is your name?", "name", "string"),
                    ));
                }
                if caps.sampling.is_some() {
                    requests.push((
                        "capital_question",
                        "sampling/createMessage",
                        sample("What is the capital of France?", 100),
                    ));
                }
                if caps.roots.is_some() {
                    requests.push(("client_roots", "roots/list", json!({})));
                }
                if requests.is_empty() {
                    return Ok(text("the client declared no capability to ask through"));
                }
                Ok(input_required(&requests, None)?.into())
            }
            "json_schema_2020_12_tool" => {
                let who = request
                    .arguments
                    .as_ref()
                    .and_then(|args| args.get("name"))
                    .and_then(Value::as_str)
                    .unwrap_or("world");
                Ok(text(format!("Hello, {who}!")))
            }
            other => Err(ErrorData::invalid_params(
                format!("unknown tool: {other}"),
                Some(json!({ "name": other })),
            )),
        }
    }
}

/// `test_missing_capability` and `test_input_required_result_sampling`: one sampling round.
fn sampling(responses: Option<&InputResponses>) -> Result<CallToolResponse, ErrorData> {
    match answer(responses, "capital_question")? {
        Answer::Valid(value) => Ok(text(format!("LLM response: {}", sampled(value)?))),
        Answer::Missing => Ok(input_required(
            &[(
                "capital_question",
                "sampling/createMessage",
                sample("What is the capital of France?", 100),
            )],
            None,
        )?
        .into()),
    }
}

fn prompts() -> Vec<Prompt> {
    vec![
        Prompt::new(
            "test_simple_prompt",
            Some("A prompt without arguments"),
            None,
        ),
        Prompt::new(
            "test_prompt_with_arguments",
            Some("A prompt with two arguments"),
            Some(vec![
                PromptArgument::new("arg1")
                    .with_description("First test argument")
                    .with_required(true),
                PromptArgument::new("arg2")
                    .with_description("Second test argument")
                    .with_required(true),
            ]),
        ),
        Prompt::new(
            "test_prompt_with_embedded_resource",
            Some("A prompt embedding a resource"),
            Some(vec![PromptArgument::new("resourceUri")
                .with_description("URI of the resource to embed")
                .with_required(true)]),
        ),
        Prompt::new(
            "test_prompt_with_image",
            Some("A prompt with an image"),
            None,
        ),
        Prompt::new(
            "test_input_required_result_prompt",
            Some("SEP-2322: a prompt that asks for context first"),
            None,
        ),
    ]
}

fn prompt_arg(request: &GetPromptRequestParams, name: &str) -> String {
    request
        .arguments
        .as_ref()
        .and_then(|args| args.get(name))
        .map(|value| match value {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        })
        .unwrap_or_default()
}

impl Fixture {
    fn prompt(&self, request: GetPromptRequestParams) -> Result<GetPromptResponse, ErrorData> {
        let messages = match request.name.as_str() {
            "test_simple_prompt" => vec![PromptMessage::new_text(
                Role::User,
                "This is a simple prompt for testing.",
            )],
            "test_prompt_with_arguments" => vec![PromptMessage::new_text(
                Role::User,
                format!(
                    "Prompt with arguments: arg1='{}', arg2='{}'",
                    prompt_arg(&request, "arg1"),
                    prompt_arg(&request, "arg2")
                ),
            )],
            "test_prompt_with_embedded_resource" => vec![
                PromptMessage::new_resource(
                    Role::User,
                    prompt_arg(&request, "resourceUri"),
                    Some("text/plain".to_owned()),
                    Some("Embedded resource content for testing.".to_owned()),
                    None,
                    None,
                    None,
                ),
                PromptMessage::new_text(Role::User, "Please process the embedded resource above."),
            ],
            "test_prompt_with_image" => vec![
                PromptMessage::new(Role::User, ContentBlock::image(PNG, "image/png")),
                PromptMessage::new_text(Role::User, "Please analyze the image above."),
            ],
            "test_input_required_result_prompt" => {
                match answer(request.input_responses.as_ref(), "user_context")? {
                    Answer::Valid(value) => vec![PromptMessage::new_text(
                        Role::User,
                        format!("Use this context: {}", elicited(value, "context")?),
                    )],
                    Answer::Missing => {
                        return Ok(input_required(
                            &[(
                                "user_context",
                                "elicitation/create",
                                elicit("What context should the prompt use?", "context", "string"),
                            )],
                            None,
                        )?
                        .into())
                    }
                }
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown prompt: {other}"),
                    Some(json!({ "name": other })),
                ))
            }
        };
        Ok(GetPromptResult::new(messages).into())
    }
}

fn read(uri: &str) -> Result<ReadResourceResult, ErrorData> {
    let contents = match uri {
        "test://static-text" => {
            ResourceContents::text("This is the content of the static text resource.", uri)
                .with_mime_type("text/plain")
        }
        "test://static-binary" => ResourceContents::blob(PNG, uri).with_mime_type("image/png"),
        _ => {
            let id = uri
                .strip_prefix("test://template/")
                .and_then(|rest| rest.strip_suffix("/data"))
                .filter(|id| !id.is_empty() && !id.contains('/'));
            let Some(id) = id else {
                return Err(ErrorData::invalid_params(
                    "Resource not found",
                    Some(json!({ "uri": uri })),
                ));
            };
            let body =
                json!({ "id": id, "templateTest": true, "data": format!("Data for ID: {id}") });
            ResourceContents::text(body.to_string(), uri).with_mime_type("application/json")
        }
    };
    Ok(ReadResourceResult::new(vec![contents])
        .with_ttl_ms(TTL_MS)
        .with_cache_scope(CacheScope::Public))
}

impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_prompts()
                .enable_resources()
                .enable_completions()
                .build(),
        )
        .with_server_info(Implementation::new(
            "mcp-idem-conformance-server",
            env!("CARGO_PKG_VERSION"),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools())
            .with_ttl_ms(TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.call(request, cx).await
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(prompts())
            .with_ttl_ms(TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        self.prompt(request)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let resources = vec![
            Resource::new("test://static-text", "Static Text Resource")
                .with_description("A static text resource")
                .with_mime_type("text/plain"),
            Resource::new("test://static-binary", "Static Binary Resource")
                .with_description("A static PNG resource")
                .with_mime_type("image/png"),
        ];
        Ok(ListResourcesResult::with_all_items(resources)
            .with_ttl_ms(TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let templates =
            vec![
                ResourceTemplate::new("test://template/{id}/data", "Templated Resource")
                    .with_description("JSON data for any id")
                    .with_mime_type("application/json"),
            ];
        Ok(ListResourceTemplatesResult::with_all_items(templates)
            .with_ttl_ms(TTL_MS)
            .with_cache_scope(CacheScope::Public))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        read(&request.uri).map(Into::into)
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        _cx: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let candidates: &[&str] = match (&request.r#ref, request.argument.name.as_str()) {
            (Reference::Prompt(_), "arg1" | "arg2") => &["paris", "park", "party"],
            (Reference::Resource(_), "id") => &["1", "2", "3"],
            _ => &[],
        };
        let prefix = request.argument.value.as_str();
        let values: Vec<String> = candidates
            .iter()
            .filter(|value| value.starts_with(prefix))
            .map(|value| (*value).to_owned())
            .collect();
        let info =
            CompletionInfo::new(values).map_err(|err| ErrorData::internal_error(err, None))?;
        Ok(CompleteResult::new(info))
    }
}
