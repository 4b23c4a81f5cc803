// The client matrix's cells for the TypeScript Anthropic SDK (`@anthropic-ai/sdk`), the twin of
// devkit/clients.py's `anthropic` cells. Node finds the SDK through NODE_PATH (scripts/bootstrap-npm
// installs it into .clients-node/):
//
//   NODE_PATH=.clients-node/node_modules node devkit/clients_anthropic.cjs --base-url http://127.0.0.1:8080 --model demo
//
// Prints one JSON object as clients.py does: `versions` and `cells` ({client, feature, ok, detail}).
"use strict";

const MAX_TOKENS = 160;
const QUESTION = "What is the weather in Paris?";
const TOOL = {
  name: "get_weather", description: "The weather in a city.",
  input_schema: { type: "object", properties: { city: { type: "string", maxLength: 12 } }, required: ["city"] },
};

function check(condition, detail) {
  if (!condition) throw new Error(detail);
}

function cells(client, model) {
  const kw = { model, temperature: 0 };
  const ask = [{ role: "user", content: QUESTION }];
  const sameKeys = (input) => JSON.stringify(Object.keys(input || {})) === JSON.stringify(["city"]);
  return {
    async messages() {
      const r = await client.messages.create({ ...kw, messages: [{ role: "user", content: "Hello" }], max_tokens: 16 });
      check(r.content.length && ["end_turn", "max_tokens"].includes(r.stop_reason), `message: ${JSON.stringify(r)}`);
      return r.stop_reason;
    },
    async "stream (text events, finalMessage)"() {
      let text = "";
      const s = client.messages.stream({ ...kw, messages: [{ role: "user", content: "Hello" }], max_tokens: 16 });
      s.on("text", (t) => { text += t; });
      const final = await s.finalMessage();
      const whole = final.content.filter((b) => b.type === "text").map((b) => b.text).join("");
      check(final.content.length && text === whole, `final: ${JSON.stringify(final)}`);
      return `${text.length} characters`;
    },
    async "forced tool call + round trip"() {
      const r = await client.messages.create({ ...kw, messages: ask, tools: [TOOL], tool_choice: { type: "any" }, max_tokens: MAX_TOKENS });
      const calls = r.content.filter((b) => b.type === "tool_use");
      check(r.stop_reason === "tool_use" && calls.length === 1 && calls[0].id.startsWith("toolu_") && sameKeys(calls[0].input),
        `content: ${JSON.stringify(r.content)}`);
      const history = [...ask, { role: "assistant", content: r.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: calls[0].id, content: "sunny" }] }];
      const again = await client.messages.create({ ...kw, messages: history, tools: [TOOL], max_tokens: 16 });
      return again.stop_reason;
    },
    async "streamed named tool call"() {
      const s = client.messages.stream({ ...kw, messages: ask, tools: [TOOL], max_tokens: MAX_TOKENS,
        tool_choice: { type: "tool", name: "get_weather" } });
      const final = await s.finalMessage();
      const calls = final.content.filter((b) => b.type === "tool_use");
      check(calls.length === 1 && calls[0].name === "get_weather" && sameKeys(calls[0].input), `content: ${JSON.stringify(final.content)}`);
      return "called";
    },
    async count_tokens() {
      const counted = (await client.messages.countTokens({ model, messages: ask, tools: [TOOL] })).input_tokens;
      const u = (await client.messages.create({ ...kw, messages: ask, tools: [TOOL], max_tokens: 1 })).usage;
      const used = u.input_tokens + (u.cache_read_input_tokens || 0) + (u.cache_creation_input_tokens || 0);
      check(counted === used, `counted ${counted}, the message used ${used}`);
      return `${counted} tokens`;
    },
  };
}

async function main() {
  const args = process.argv.slice(2);
  const arg = (name) => args[args.indexOf(name) + 1];
  const baseURL = arg("--base-url").replace(/\/v1$/, "");
  const model = arg("--model");
  const Anthropic = require("@anthropic-ai/sdk").default;
  // The SDK exports no `./package.json`: read it beside its entry point.
  const fs = require("fs");
  const path = require("path");
  let dir = path.dirname(require.resolve("@anthropic-ai/sdk"));
  while (!fs.existsSync(path.join(dir, "package.json"))) dir = path.dirname(dir);
  const version = JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
  const client = new Anthropic({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120000 });
  const out = [];
  for (const [feature, cell] of Object.entries(cells(client, model))) {
    try {
      out.push({ client: "@anthropic-ai/sdk", feature, ok: true, detail: String(await cell()).slice(0, 200) });
    } catch (e) {
      out.push({ client: "@anthropic-ai/sdk", feature, ok: false, detail: `${e.constructor.name}: ${String(e.message).slice(0, 300)}` });
    }
  }
  process.stdout.write(JSON.stringify({ versions: { "@anthropic-ai/sdk": version }, cells: out }, null, 1) + "\n");
}

main().catch((e) => { console.error(e); process.exit(1); });
