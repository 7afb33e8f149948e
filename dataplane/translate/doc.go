// Package translate converts between the Anthropic Messages API spoken by
// Claude Code and the OpenAI Responses API spoken by the ChatGPT Codex
// backend over its WebSocket. It does no I/O: the gateway feeds it bodies
// and frames and gives it an EventWriter.
//
// Request direction:
//
//   - DecodeRequest validates a Messages body (a *RequestError names the bad
//     field);
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
//     committed stream alive;
//   - OutputItems and Usage describe the completed response (for the head
//     snapshot and accounting);
//   - a Collector is an EventWriter that turns the same events into the
//     non-streaming Message JSON.
//
// Errors: ClassifyUpgrade and ClassifyFrame map upstream failures to an
// *UpstreamError (status, Anthropic type, our own message, retry hint);
// ErrorBody renders it. CountTokens is the local count_tokens estimate.
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
