package translate

import "github.com/clodex/clodex/dataplane/retry"

func (s *Stream) fail(e *retry.UpstreamError) {
	if e == nil {
		e = retry.NewUpstreamError(502, "", "OpenAI ended the response with an unreadable failure event")
	}
	s.state = StateFailed
	s.failure = retry.Overflow(e, s.turn.ContextWindow, s.turn.EstimatedInputTokens)
}

func handled(t string) bool {
	switch t {
	case "response.output_item.added", "response.output_item.done", "response.output_text.delta",
		"response.reasoning_summary_text.delta", "response.reasoning_summary_part.added",
		"response.function_call_arguments.delta", "response.completed", "response.done",
		"response.incomplete", "response.failed", "error":
		return true
	}
	return false
}

// Failure is the classified failure once Handle returned StateFailed.
func (s *Stream) Failure() *retry.UpstreamError { return s.failure }

// Abort ends a committed response with an SSE error event (no
// message_stop; docs/errors.md §8.3). A nil e uses Failure(), or a generic api_error.
// A context overflow carries the "prompt is too long" message.
func (s *Stream) Abort(e *retry.UpstreamError) error {
	if e == nil {
		e = s.failure
	}
	if e == nil {
		e = retry.NewUpstreamError(502, "", "Upstream model request failed.")
	}
	s.finished = true
	if s.state == StateRunning {
		s.state = StateFailed
		s.failure = e
	}
	return s.write("error", retry.ErrorBody(retry.Overflow(e, s.turn.ContextWindow, s.turn.EstimatedInputTokens)))
}

// Resumable reports whether the turn may still be retried on the same
// downstream message after this response failed: what went out
// (message_start, blocks opened but still empty, pings) carries nothing
// the client keeps — no delta, no tool_use block (a client would run the
// call), no message_delta or error event.
func (s *Stream) Resumable() bool { return !s.delivered && !s.toolOpened && !s.finished }

// Resume returns the Stream of the turn's next attempt, continuing this
// one's downstream message: the open block, still empty, is closed with
// content_block_stop; message_start is not written again and block
// indices go on. The returned error is a write error. Call it only when
// Resumable; s must not be used afterwards.
func (s *Stream) Resume() (*Stream, error) {
	n := NewStream(s.turn, s.w, s.msgID)
	n.sse, n.started, n.nextIndex = s.sse, s.started, s.nextIndex
	if s.open != nil {
		b := append(s.buf[:0], `{"type":"content_block_stop","index":`...)
		b = appendInt(b, s.openIndex)
		b = append(b, '}')
		s.buf, s.open = b, nil
		if err := s.write("content_block_stop", b); err != nil {
			return nil, err
		}
	}
	return n, nil
}
