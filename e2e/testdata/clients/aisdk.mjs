// The Vercel AI SDK (ai 7, @ai-sdk/anthropic 4.0) as its users drive it, against
// ANTHROPIC_BASE_URL: one JSON line per case on stdout, what the user sees.
import { createAnthropic } from "@ai-sdk/anthropic";
import { generateText, streamText, tool, Output, stepCountIs } from "ai";
import { z } from "zod";

const anthropic = createAnthropic({ baseURL: process.env.ANTHROPIC_BASE_URL + "/v1", apiKey: process.env.ANTHROPIC_API_KEY });
const model = anthropic("claude-sonnet-4-5");
const out = (c, v) => console.log(JSON.stringify({ case: c, ...v }));
const failure = (e) => ({ error: { name: e.name, message: e.message, statusCode: e.statusCode ?? e.lastError?.statusCode,
  reason: e.reason, attempts: e.errors?.length, headers: e.responseHeaders ?? e.lastError?.responseHeaders } });
const run = async (c, f) => { try { out(c, await f()); } catch (e) { out(c, failure(e)); } };

await Promise.all([
  run("generateText", async () => {
    const r = await generateText({ model, prompt: "Greet me.\n#sim reply Hello from the AI SDK" });
    return { text: r.text, finishReason: r.finishReason, usage: r.usage };
  }),
  run("streamText", async () => {
    const r = streamText({ model, prompt: "Stream it.\n#sim reply streamed to the AI SDK in pieces" });
    const chunks = [];
    for await (const t of r.textStream) chunks.push(t);
    return { chunks, usage: await r.usage, finishReason: await r.finishReason };
  }),
  run("tools", async () => {
    const calls = [];
    const r = await generateText({
      model, stopWhen: stepCountIs(3), prompt: 'What is the weather?\n#sim call weather {"city":"Paris"}',
      tools: { weather: tool({ description: "The weather in a city", inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => { calls.push(city); return `sunny in ${city}`; } }) },
    });
    return { calls, steps: r.steps.length, text: r.text, finishReason: r.finishReason };
  }),
  run("Output.object", async () => {
    const r = await generateText({ model, prompt: "Which city?\n#sim reply not JSON",
      output: Output.object({ schema: z.object({ city: z.string(), population: z.number().int(), tags: z.array(z.string()) }) }) });
    return { object: r.output, usage: r.usage };
  }),
  run("usage limit", async () => {
    const r = await generateText({ model, prompt: "Go on.\n#sim usage-limit 9000 pro\nThanks." });
    return { text: r.text };
  }),
]);
