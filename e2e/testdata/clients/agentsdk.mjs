// The Claude Agent SDK 0.3 as its users drive it: a tool loop, then a resumed session, each
// with the pinned Claude Code (CLAUDE_CODE_EXECUTABLE) against ANTHROPIC_BASE_URL. One JSON
// line per case on stdout, what the user sees.
import { query } from "@anthropic-ai/claude-agent-sdk";

const options = { pathToClaudeCodeExecutable: process.env.CLAUDE_CODE_EXECUTABLE, model: "claude-sonnet-4-5",
  cwd: process.cwd(), allowedTools: ["Bash(echo:*)"], settingSources: [] };
const out = (c, v) => console.log(JSON.stringify({ case: c, ...v }));

// session runs one prompt and returns the session id, the tool calls and the result message.
const session = async (prompt, extra) => {
  const seen = { tools: [], toolResults: [] };
  for await (const m of query({ prompt, options: { ...options, ...extra } })) {
    if (m.type === "assistant") for (const b of m.message.content) if (b.type === "tool_use") seen.tools.push({ name: b.name, input: b.input });
    if (m.type === "user" && Array.isArray(m.message.content)) for (const b of m.message.content) if (b.type === "tool_result") seen.toolResults.push(b.content);
    if (m.type === "result") seen.result = { subtype: m.subtype, is_error: m.is_error, result: m.result, num_turns: m.num_turns, session_id: m.session_id, usage: m.usage };
  }
  return seen;
};
try {
  const loop = await session('Run the echo command.\n#sim call Bash {"command":"echo agent-sdk-marker","description":"echo"}');
  out("tool loop", loop);
  out("resume", await session("What did the command print?\n#sim reply It printed agent-sdk-marker.", { resume: loop.result?.session_id }));
} catch (e) {
  out("error", { error: { name: e.name, message: e.message } });
}
