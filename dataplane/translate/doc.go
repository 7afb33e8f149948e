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
// Request: DecodeRequest, and DecodeCountTokens whose EstimatedTokens is
// the count_tokens answer (CountTokens estimates any JSON object). A
// ModelTable (DefaultModels, ParseModelAliases, WithPassthrough) checks
// and resolves model names and lists them for GET /v1/models (List,
// Info). ToResponses gives a Turn; CreateFrame renders its response.create
// frame, whole or as a continuation; CanonicalItem is the form the pool
// compares a socket's history in.
//
// Response: a Stream writes Anthropic events to an EventWriter: an SSE
// (event/data frames, the headers with the first event; NewSSEStream
// flushes once per upstream event) or a Collector, which builds the
// non-streaming Message JSON (NewStream). Ping keeps a committed stream
// alive; a failed response is Resumable when the client got nothing it
// keeps, and Resume continues the same message on the next attempt; Abort
// ends it with an error event.
//
// Errors: a body that cannot be sent is a *RequestError naming the field.
// A failed response's Failure is classified by dataplane/retry (the
// failure table: ClassifyFrame), which also renders the error body.
//
// Files by concern. On every turn: jsondoc.go, the one-pass JSON parser
// (it accepts exactly what encoding/json accepts and yields the same
// values) with the string encoder; request.go, decoding and validation;
// tokens.go, the count_tokens estimate; responses.go, the mapping to a
// Turn, its frame and the model resolution; items.go, the input and
// output items and their canonical form; stream.go, the Stream and the SSE
// it writes; upevents.go, the backend's events. Only when a turn needs
// them: attachments.go (images, documents, search results: decoding and
// mapping), requesterror.go (a refused body), failure.go (a failed
// response), collector.go (a non-streaming answer), errors.go (RequestError),
// models.go (the table's construction and the /v1/models list).
//
// Cost: a body is parsed once; the decoding, the canonical tool-call
// arguments, the compact tool schemas and the count_tokens estimate (a
// byte count, computed without re-serialising) all read that parse.
// Schemas and tool_result blocks without whitespace are forwarded as the
// client's bytes, and CreateFrame does not re-validate the items it built
// itself. The goldens in testdata/ pin the frames byte for byte.
//
// The behaviour is written down in docs/translation.md (the request
// mapping, §1 to §8; the events, §9 to §11).
package translate
