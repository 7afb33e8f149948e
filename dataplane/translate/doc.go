// Package translate converts between the Anthropic Messages API Claude
// Code speaks and the OpenAI Responses API of the ChatGPT Codex backend:
// it decodes and validates a Messages body, maps it to a response.create
// frame, and streams the backend's events back to the client as Anthropic
// server-sent events. It opens no connection: the gateway hands it the
// body, each upstream frame and the http.ResponseWriter.
//
// One streaming turn, as the gateway drives it:
//
//	req, err := translate.DecodeRequest(body) // a *RequestError names the field
//	err = models.Check(req.Model())           // a *RequestError lists what is accepted
//	turn, err := translate.ToResponses(req, translate.Options{Models: models, SessionHeader: id})
//	frame, err := turn.CreateFrame(previousResponseID, turn.Input[delta:]) // sent upstream
//	s := translate.NewSSEStream(turn, translate.NewSSE(w), msgID)
//	state, err := s.Handle(event) // per upstream event: what it determines, one flush
//	err = s.Finish()              // at StateCompleted; at StateFailed see Failure, Abort, Resume
//	items, usage := s.OutputItems(), s.Usage() // the head snapshot, in CanonicalItem form
//
// The files by concern. On every turn: jsondoc.go, the one-pass JSON
// parser (it accepts exactly what encoding/json accepts and yields the
// same values) with the string encoder; request.go, [DecodeRequest] and
// [DecodeCountTokens], decoding and validation; tokens.go, the
// count_tokens estimate ([CountTokens]); responses.go, [ToResponses], the
// [Turn], its frame and the model resolution; items.go, the input and
// output items and their canonical form ([CanonicalItem], what the pool
// compares); stream.go, the [Stream] (one thinking block per reasoning
// item, always signed; pings, [Stream.Resumable] and [Stream.Resume] for a
// retried attempt, Abort's error event); sse.go, the [SSE] it writes (one
// flush per upstream event); upevents.go, the backend's events. Only when a turn needs them: attachments.go (images, documents,
// search results), requesterror.go and errors.go (a refused body,
// [RequestError]), failure.go (a failed response, classified by
// dataplane/retry's failure table), collector.go (the non-streaming
// answer, [Collector]), models.go (the [ModelTable]: [DefaultModels],
// [ParseModelAliases], WithPassthrough, the /v1/models list).
//
// Cost: a body is parsed once; the decoding, the canonical tool-call
// arguments, the compact tool schemas and the count_tokens estimate (a
// byte count, computed without re-serialising) all read that parse.
// Schemas and tool_result blocks without whitespace are forwarded as the
// client's bytes, and CreateFrame does not re-validate the items it built
// itself. The goldens in testdata/ pin the frames byte for byte.
//
// The behaviour is specified in docs/translation.md: the request mapping
// (§1 to §8) and the events, count_tokens and non-streaming answers (§9 to
// §11).
package translate
