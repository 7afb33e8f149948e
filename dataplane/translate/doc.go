// Package translate converts between the Anthropic Messages API spoken by
// Claude Code and the OpenAI Responses API spoken by the ChatGPT Codex
// backend over its WebSocket. It does no I/O: the gateway feeds it bodies
// and frames and gives it an EventWriter.
//
// Request direction:
//
//   - DecodeRequest validates a Messages body (a *RequestError names the bad
//     field and what is allowed), refusing before any socket whatever the
//     upstream would certainly reject; DecodeCountTokens does the same for
//     a count_tokens body (max_tokens optional), whose EstimatedTokens is
//     the answer;
//   - ModelTable.Check refuses a model name no alias matches and no known
//     upstream model has, listing what is accepted (WithPassthrough turns
//     the check off); List and Info describe the accepted names for
//     GET /v1/models, each with its upstream model;
//   - ToResponses turns it into a Turn: upstream model (via a ModelTable),
//     effort, prompt_cache_key, the full input items, the token estimate;
//   - Turn.CreateFrame renders the response.create frame, optionally with a
//     shortened input and previous_response_id for a continuation;
//   - CanonicalItem gives the comparison form used to match a retained
//     socket's history against a new request (prefix matching).
//
// Response direction:
//
//   - a Stream consumes upstream events with Handle and writes Anthropic SSE
//     events to an EventWriter as soon as they are determined; Finish ends a
//     completed response, Abort a failed one after output, Ping keeps a
//     committed stream alive; a response that failed after it only began
//     the message (message_start, empty blocks) is Resumable, and Resume
//     continues the same message for the next attempt;
//   - OutputItems and Usage describe the completed response (for the head
//     snapshot and accounting);
//   - a Collector is an EventWriter that turns the same events into the
//     non-streaming Message JSON.
//
// What is carried where. User messages: text, image (PNG, JPEG, GIF or
// WebP, base64 or an http(s) URL), document (a base64 PDF or a PDF URL as
// an input_file part, a text or content source as input_text and
// input_image parts, a title or context as a leading input_text line),
// search_result (input_text), tool_result, tool_reference. A tool_result's
// content is sent as the function_call_output string; its images and
// documents are lifted into the next user message, a note marking where
// each was. Assistant messages: text, tool_use, and thinking with a
// signature (a reasoning item). Unsigned thinking and redacted_thinking
// are not replayed: like the Messages API itself, the backend gets no
// earlier turn's thinking it cannot verify. System messages: text. Any
// other block, or a block where it cannot be carried, is a 400 naming
// messages[i].content[j].type: nothing is dropped silently.
//
// Errors: ClassifyUpgrade and ClassifyFrame map upstream failures to an
// *UpstreamError (status, Anthropic type, our own message, retry hint, the
// reset of a usage limit). The error code decides before the error type: a
// table of the codes the backend is known to send (overload codes give
// 529), then the substring rules on the code, then on the type; an unknown
// failure is 502. A message says what happened and, for a failure no retry
// can fix, that retrying will not help; a usage limit says when it resets.
// ErrorBody renders the Anthropic error body. CountTokens is the local
// count_tokens estimate of any JSON object.
//
// Cost: a request body is parsed once, by a validating one-pass parser
// (jsondoc.go) that accepts exactly what encoding/json accepts and yields
// the same decoded values; the decoding, the canonical tool-call
// arguments, the compact tool schemas and the count_tokens estimate (a
// byte count, computed without re-serialising) all read that one parse.
// Schemas and tool_result blocks without whitespace are forwarded as the
// client's bytes. Turn.CreateFrame does not re-validate the items it built
// itself. The goldens in testdata/ pin the frames byte for byte.
//
// The behaviour is written down in docs/translation.md (the request
// mapping, §1 to §8; the events, §9 to §11) and docs/errors.md (the
// classification of failures, §2 and §4).
package translate
