package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/coder/websocket"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
)

// Turn outcomes, the label of clodex_dataplane_turn_seconds.
const (
	outcomeCompleted  = "completed"
	outcomeFailed     = "failed"
	outcomeClientGone = "client_gone"
)

func (s *Server) serveMessages(w *record, r *http.Request) {
	body, herr := s.readBody(r)
	if herr != nil {
		w.err = herr
		writeError(w, herr.status, herr.typ, herr.message)
		return
	}
	req, err := translate.DecodeRequest(body)
	if err != nil {
		w.err = err
		writeError(w, http.StatusBadRequest, "invalid_request_error", requestErrorMessage(err))
		return
	}
	w.model = req.Model()
	turn, err := translate.ToResponses(req, translate.Options{
		Models:        s.cfg.Models,
		SessionHeader: r.Header.Get("X-Claude-Code-Session-Id"),
	})
	if err != nil {
		w.err = err
		writeError(w, http.StatusBadRequest, "invalid_request_error", requestErrorMessage(err))
		return
	}

	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	h, ok := s.track(cancel)
	if !ok {
		w.err = errShuttingDown
		writeError(w, http.StatusServiceUnavailable, "api_error", "The data plane is shutting down; retry on another instance")
		return
	}
	defer s.untrack(h)
	ctx, cancelTotal := context.WithTimeoutCause(ctx, s.cfg.TotalTimeout, errTotalTimeout)
	defer cancelTotal()
	ctx, span := s.tracer.Start(ctx, "Gateway.Messages", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("clodex.model.requested", turn.RequestedModel),
		attribute.String("clodex.model.upstream", turn.Model),
		attribute.Bool("clodex.stream", turn.Stream),
	))
	defer span.End()

	start := time.Now()
	t := &turnRun{s: s, w: w, turn: turn, span: span}
	outcome := t.run(ctx)
	s.metrics.turns.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
	span.SetAttributes(attribute.String("clodex.outcome", outcome), attribute.Int("http.response.status_code", w.status))
	if w.err != nil && outcome != outcomeCompleted {
		span.RecordError(w.err)
		span.SetStatus(codes.Error, outcome)
	}
}

// turnRun is one /v1/messages turn; it lives on the handler's goroutine.
type turnRun struct {
	s    *Server
	w    *record
	turn *translate.Turn
	span trace.Span

	sse       *sseWriter           // nil for a non-streaming request
	collector *translate.Collector // nil for a streaming request
	stream    *translate.Stream
}

// frameResult is one upstream event (or the read error that ended the
// socket), handed from readLoop to the turn.
type frameResult struct {
	data []byte
	err  error
}

func (t *turnRun) run(ctx context.Context) string {
	s := t.s
	cred, err := s.cfg.Credentials.Credential(ctx)
	if err != nil {
		s.bg.Done()
		if ctx.Err() != nil {
			return t.ctxEnded(ctx)
		}
		t.w.err = fmt.Errorf("get credential: %w", err)
		writeError(t.w, http.StatusUnauthorized, "authentication_error", "OAuth credential is unavailable")
		return outcomeFailed
	}
	conn, err := s.cfg.Dialer.Dial(ctx, cred, t.turn)
	if err != nil {
		s.bg.Done()
		if ctx.Err() != nil {
			s.metrics.dials.WithLabelValues("error").Inc()
			return t.ctxEnded(ctx)
		}
		var ue *upstream.UpgradeError
		var f *translate.UpstreamError
		if errors.As(err, &ue) {
			s.metrics.dials.WithLabelValues("refused").Inc()
			f = translate.ClassifyUpgrade(ue.Status, ue.RetryAfter)
		} else {
			s.metrics.dials.WithLabelValues("error").Inc()
			f = translate.ClassifyUpgrade(0, "")
		}
		t.w.err = fmt.Errorf("dial upstream: %w", err)
		t.writeUpstreamError(f)
		return outcomeFailed
	}
	s.metrics.dials.WithLabelValues("ok").Inc()

	// The reader runs under its own context so that a cancelled turn can
	// first send a close frame with a reason, then stop the reader.
	readCtx, stopRead := context.WithCancel(context.WithoutCancel(ctx))
	frames := make(chan frameResult)
	readDone := make(chan struct{})
	go readLoop(readCtx, conn, frames, readDone)
	code, reason := websocket.StatusNormalClosure, "turn complete"
	defer func() {
		// Closing waits for the peer's close frame; do it off the
		// response path. Server.Close waits for it (bg).
		go s.closeSocket(conn, code, reason, stopRead, readDone)
	}()

	msgID := newID("msg_")
	var ew translate.EventWriter
	if t.turn.Stream {
		t.sse = newSSEWriter(t.w)
		ew = t.sse
	} else {
		t.collector = translate.NewCollector()
		ew = t.collector
	}
	t.stream = translate.NewStream(t.turn, ew, msgID)

	frame, err := t.turn.CreateFrame("", t.turn.Input)
	if err != nil {
		t.w.err = fmt.Errorf("render response.create: %w", err)
		writeError(t.w, http.StatusInternalServerError, "api_error", "Could not build the upstream request")
		code, reason = websocket.StatusNormalClosure, "turn failed"
		return outcomeFailed
	}
	if err := conn.Send(ctx, frame); err != nil {
		if ctx.Err() != nil {
			code, reason = closeFor(ctx)
			return t.ctxEnded(ctx)
		}
		t.w.err = err
		code, reason = websocket.StatusNormalClosure, "turn failed"
		return t.fail(transportFailure())
	}
	outcome, c, rsn := t.loop(ctx, frames)
	code, reason = c, rsn
	return outcome
}

// loop feeds upstream events to the Stream until the response ends. It
// returns the outcome and the close code and reason for the socket.
func (t *turnRun) loop(ctx context.Context, frames <-chan frameResult) (string, websocket.StatusCode, string) {
	cfg := &t.s.cfg
	idle := time.NewTimer(cfg.IdleTimeout)
	defer idle.Stop()
	var tick <-chan time.Time
	var lastTick, lastUpstream time.Time
	if t.sse != nil {
		ticker := time.NewTicker(cfg.PingInterval)
		defer ticker.Stop()
		tick = ticker.C
		lastTick = time.Now()
	}
	for {
		select {
		case fr := <-frames:
			if fr.err != nil {
				t.w.err = fr.err
				return t.fail(transportFailure()), websocket.StatusNormalClosure, "upstream read failed"
			}
			idle.Reset(cfg.IdleTimeout)
			if tick != nil {
				lastUpstream = time.Now()
			}
			state, err := t.stream.Handle(fr.data)
			if err != nil {
				t.w.err = fmt.Errorf("write downstream: %w", err)
				return outcomeClientGone, websocket.StatusGoingAway, "client disconnected"
			}
			switch state {
			case translate.StateCompleted:
				return t.complete(), websocket.StatusNormalClosure, "turn complete"
			case translate.StateFailed:
				f := t.stream.Failure()
				t.w.err = f
				return t.fail(f), websocket.StatusNormalClosure, "turn failed"
			}
		case <-idle.C:
			f := &translate.UpstreamError{Status: http.StatusBadGateway, Type: "api_error",
				Message: fmt.Sprintf("no data received from upstream for %v", cfg.IdleTimeout)}
			t.w.err = f
			return t.fail(f), websocket.StatusNormalClosure, "idle timeout"
		case now := <-tick:
			// Ping a committed stream when nothing went downstream since the
			// last tick while the backend is still sending (e.g. a long tool
			// call whose arguments are buffered).
			if !t.sse.lastWrite.After(lastTick) && now.Sub(lastUpstream) < cfg.PingInterval {
				if _, err := t.stream.Ping(); err != nil {
					t.w.err = fmt.Errorf("write downstream: %w", err)
					return outcomeClientGone, websocket.StatusGoingAway, "client disconnected"
				}
			}
			lastTick = now
		case <-ctx.Done():
			code, reason := closeFor(ctx)
			return t.ctxEnded(ctx), code, reason
		}
	}
}

// complete ends a completed response downstream.
func (t *turnRun) complete() string {
	if err := t.stream.Finish(); err != nil {
		t.w.err = fmt.Errorf("write downstream: %w", err)
		return outcomeClientGone
	}
	if t.collector != nil {
		msg, err := t.collector.Message()
		if err != nil {
			t.w.err = err
			t.writeUpstreamError(&translate.UpstreamError{Status: http.StatusBadGateway, Type: "api_error",
				Message: "The upstream response could not be assembled into a message"})
			return outcomeFailed
		}
		writeJSON(t.w, http.StatusOK, msg)
	}
	t.span.SetAttributes(attribute.String("clodex.upstream.response_id", t.stream.ResponseID()))
	return outcomeCompleted
}

// fail reports f: an SSE error event after output, else a real status.
func (t *turnRun) fail(f *translate.UpstreamError) string {
	if t.sse != nil && t.stream != nil && t.stream.Committed() {
		if err := t.stream.Abort(f); err != nil {
			return outcomeClientGone
		}
		return outcomeFailed
	}
	t.writeUpstreamError(f)
	return outcomeFailed
}

// ctxEnded handles the end of the turn's context: a total deadline or a
// shutdown is reported to the client; a client that went away gets
// nothing.
func (t *turnRun) ctxEnded(ctx context.Context) string {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errTotalTimeout):
		t.w.err = cause
		return t.fail(&translate.UpstreamError{Status: http.StatusBadGateway, Type: "api_error",
			Message: fmt.Sprintf("upstream response exceeded %v", t.s.cfg.TotalTimeout)})
	case errors.Is(cause, errShuttingDown):
		t.w.err = cause
		return t.fail(&translate.UpstreamError{Status: http.StatusServiceUnavailable, Type: "api_error",
			Message: "The data plane is shutting down; retry the request"})
	default:
		t.w.err = fmt.Errorf("client went away: %w", cause)
		return outcomeClientGone
	}
}

func closeFor(ctx context.Context) (websocket.StatusCode, string) {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errTotalTimeout):
		return websocket.StatusNormalClosure, "total deadline exceeded"
	case errors.Is(cause, errShuttingDown):
		return websocket.StatusGoingAway, "server shutting down"
	default:
		return websocket.StatusGoingAway, "client disconnected"
	}
}

func transportFailure() *translate.UpstreamError {
	return &translate.UpstreamError{Status: http.StatusBadGateway, Type: "api_error",
		Message: "The upstream connection ended before the response completed"}
}

// writeUpstreamError answers a failure that happened before any output
// with its classified status and body (spec 5.6).
func (t *turnRun) writeUpstreamError(f *translate.UpstreamError) {
	status := f.Status
	if status == http.StatusInternalServerError || status < 400 || status > 599 {
		status = http.StatusBadGateway
	}
	if f.RetryAfter > 0 {
		secs := int((f.RetryAfter + time.Second - 1) / time.Second)
		t.w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	writeJSON(t.w, status, translate.ErrorBody(f))
}

// readLoop reads upstream events until the socket fails or ctx ends; it is
// the socket's only reader while the turn is active.
func readLoop(ctx context.Context, conn Conn, out chan<- frameResult, done chan<- struct{}) {
	defer close(done)
	for {
		data, err := conn.Next(ctx)
		select {
		case out <- frameResult{data: data, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
	}
}

// closeSocket closes a turn's socket with code and reason, then stops its
// reader and waits for it. It runs in the background, owned by the Server
// (bg).
func (s *Server) closeSocket(conn Conn, code websocket.StatusCode, reason string, stopRead context.CancelFunc, readDone <-chan struct{}) {
	defer s.bg.Done()
	conn.Close(code, reason)
	stopRead()
	<-readDone
}
