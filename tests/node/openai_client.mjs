// OpenAI's Node client, unchanged, against a live server: node openai_client.mjs BASE_URL MODEL
// Prints one JSON object with what each call gave (tests/test_serve_tools.py compares it with the
// same requests made over plain HTTP).
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0, timeout: 300_000 });

const WEATHER = {
  type: "function",
  function: {
    name: "get_weather", description: "Get the current weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
};
const CALL = [{ role: "user", content: "Weather in Paris and in Rome?" }, { role: "assistant", content: "<tool_call>\n" }];
const CAT = {
  type: "object", properties: { name: { type: "string" }, legs: { type: "integer" } },
  required: ["name", "legs"], additionalProperties: false,
};
const out = {};

// tools, required: the calls as objects, then their results sent back
const tools = await client.chat.completions.create(
  { model, messages: CALL, tools: [WEATHER], tool_choice: "required", max_tokens: 48, temperature: 0 });
const calls = tools.choices[0].message.tool_calls;
out.tool_calls = calls.map((c) => c.function);
out.tool_finish = tools.choices[0].finish_reason;
const follow = [CALL[0], { role: "assistant", content: null, tool_calls: calls },
  ...calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: '{"temp_c": 21}' }))];
const answer = await client.chat.completions.create(
  { model, messages: follow, tools: [WEATHER], max_tokens: 24, temperature: 0 });
out.follow_up = answer.choices[0].message.content;

// the same tool request streamed: the deltas of each call added up
const stream = await client.chat.completions.create(
  { model, messages: CALL, tools: [WEATHER], tool_choice: "required", max_tokens: 48, temperature: 0, stream: true });
const streamed = [];
for await (const chunk of stream) {
  for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) {
    streamed[tc.index] ??= { name: "", arguments: "" };
    streamed[tc.index].name += tc.function?.name ?? "";
    streamed[tc.index].arguments += tc.function?.arguments ?? "";
  }
  if (chunk.choices[0]?.finish_reason) out.streamed_finish = chunk.choices[0].finish_reason;
}
out.streamed_calls = streamed;

// structured output, and plain text whole and streamed
const cat = await client.chat.completions.create({
  model, messages: [{ role: "user", content: "A cat as JSON with its name and legs." }], max_tokens: 48, temperature: 0,
  response_format: { type: "json_schema", json_schema: { name: "cat", schema: CAT } },
});
out.cat = cat.choices[0].message.content;
const haiku = { model, messages: [{ role: "user", content: "Write a haiku about the sea." }], max_tokens: 24, temperature: 0 };
out.text = (await client.chat.completions.create(haiku)).choices[0].message.content;
out.text_streamed = "";
for await (const chunk of await client.chat.completions.create({ ...haiku, stream: true })) {
  out.text_streamed += chunk.choices[0]?.delta?.content ?? "";
}
out.completion = (await client.completions.create(
  { model, prompt: "def fibonacci(n):", max_tokens: 16, temperature: 0 })).choices[0].text;

// a bad request: the client's own error, with the field at fault
try {
  await client.chat.completions.create({ model, messages: [{ role: "user", content: "x" }], max_tokens: -3 });
  out.error = null;
} catch (e) {
  out.error = { status: e.status, param: e.param ?? e.error?.param ?? null, type: e.constructor.name };
}
console.log(JSON.stringify(out));
