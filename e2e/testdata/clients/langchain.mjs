// LangChain's @langchain/anthropic 1.5 as its users drive it, against
// ANTHROPIC_BASE_URL: one JSON line per case on stdout, what the user sees.
import { ChatAnthropic } from "@langchain/anthropic";
import { AIMessage, HumanMessage } from "@langchain/core/messages";
import { z } from "zod";

const model = new ChatAnthropic({ model: "claude-sonnet-4-5", anthropicApiUrl: process.env.ANTHROPIC_BASE_URL,
  apiKey: process.env.ANTHROPIC_API_KEY, maxRetries: 0 });
const out = (c, v) => console.log(JSON.stringify({ case: c, ...v }));
const run = async (c, f) => { try { out(c, await f()); } catch (e) { out(c, { error: { name: e.name, message: e.message, status: e.status } }); } };

// stream: the text and the usage LangChain reports, first turn and a continued one.
const stream = async (messages) => {
  let msg;
  for await (const chunk of await model.stream(messages)) msg = msg ? msg.concat(chunk) : chunk;
  return { text: msg.text, usage: msg.usage_metadata };
};
await Promise.all([
  run("stream with usage", async () => {
    const first = [new HumanMessage("Count to three.\n#sim reply one two three, streamed through LangChain")];
    const one = await stream(first);
    const two = await stream([...first, new AIMessage(one.text), new HumanMessage("Again.\n#sim reply four five")]);
    return { first: one, second: two };
  }),
  run("withStructuredOutput", async () => {
    const structured = model.withStructuredOutput(z.object({ answer: z.string(), confidence: z.number() }), { method: "jsonSchema" });
    return { object: await structured.invoke("How sure are you?\n#sim reply not JSON") };
  }),
]);
