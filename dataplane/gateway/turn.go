package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/dataplane/upstream"
	"github.com/clodex/clodex/internal/codexauth"
)

// Turn outcomes, the label of clodex_dataplane_turn_seconds.
const (
	outcomeCompleted  = "completed"
	outcomeFailed     = "failed"
	outcomeClientGone = "client_gone"
)

func (s *Server) serveMessages(w *record, r *http.Request) {
	body, herr := s.readBody(w, r)
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
	if err := s.cfg.Models.Check(req.Model()); err != nil {
		w.err = err
		writeError(w, http.StatusBadRequest, "invalid_request_error", requestErrorMessage(err))
		return
	}
	turn, err := translate.ToResponses(req, translate.Options{
		Models:        s.cfg.Models,
		SessionHeader: r.Header.Get("X-Claude-Code-Session-Id"),
	})
	if err != nil {
		w.err = err
		writeError(w, http.StatusBadRequest, "invalid_request_error", requestErrorMessage(err))
		return
	}

	ctx, cancel := context.WithCancelCause(withRequestedAccount(r.Context(), r))
	defer cancel(nil)
	h, ok := s.track(cancel)
	if !ok {
		w.err = errShuttingDown
		e := retry.Answer(w.Header(), &retry.UpstreamError{Status: http.StatusServiceUnavailable, Type: "api_error",
			Message: "The data plane is shutting down; retry on another instance"}, retry.Facts{}, s.rand)
		writeJSON(w, e.Status, retry.ErrorBody(e))
		return
	}
	defer s.untrack(h)
	ctx, span := s.tracer.Start(ctx, "Gateway.Messages", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	recording := span.IsRecording() // no attribute work for a no-op tracer
	if recording {
		span.SetAttributes(
			attribute.String("clodex.model.requested", turn.RequestedModel),
			attribute.String("clodex.model.upstream", turn.Model),
			attribute.Bool("clodex.stream", turn.Stream),
		)
	}

	start := time.Now()
	t := &turnRun{s: s, w: w, turn: turn, span: span, msgID: newID("msg_")}
	outcome := t.run(ctx)
	t.reportUsage(r.Context(), outcome)
	s.metrics.turns.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
	if outcome == outcomeFailed {
		w.failed = true
		w.attempts = t.attempts
		label := strconv.Itoa(w.status)
		if t.clientSawOutput() {
			label = "stream" // an SSE error event after a 200
		}
		s.metrics.failedTurns.WithLabelValues(label).Inc()
	}
	if !recording {
		return
	}
	span.SetAttributes(attribute.String("clodex.outcome", outcome), attribute.Int("http.response.status_code", w.status),
		attribute.Int("clodex.attempts", t.attempts))
	if w.err != nil && outcome != outcomeCompleted {
		span.RecordError(w.err)
		span.SetStatus(codes.Error, outcome)
	}
}

// Reasons a turn gives Lease.Discard (the pool closes the socket at once
// and counts the reason).
const (
	reasonClientGone = "client disconnected"
	reasonShutdown   = "server shutting down"
	reasonFailed     = "turn failed"
	reasonIdle       = "idle timeout"
	reasonTotal      = "total deadline exceeded"
)

// turnRun is one /v1/messages turn; it lives on the handler's goroutine.
type turnRun struct {
	s     *Server
	w     *record
	turn  *translate.Turn
	span  trace.Span
	msgID string

	part       pool.Partition // Account: the key of the turn's account
	items      [][]byte       // canonical items of turn.Input
	refreshed  bool           // Router.Rejected was called for this turn
	attempts   int
	newSockets int  // upstream sockets the turn opened (its usage)
	refused    bool // the last socket the turn asked for was refused by admission

	// pending is a lease whose attempt failed with a Replace-class
	// failure: the next attempt replaces it (or discards it).
	pending       *pool.Lease
	pendingReason string

	sse       *translate.SSE       // nil for a non-streaming request
	collector *translate.Collector // nil for a streaming request
	stream    *translate.Stream    // the current attempt's stream
	outcome   string               // set by the attempt that ended the turn
}

// errClientGone ends a turn whose client stopped reading.
var errClientGone = errors.New("client went away")

func (t *turnRun) run(ctx context.Context) string {
	s := t.s
	defer s.bg.Done()
	t.items = make([][]byte, len(t.turn.Input))
	for i, it := range t.turn.Input {
		c, err := translate.CanonicalItem(it)
		if err != nil {
			t.w.err = fmt.Errorf("canonicalize input item %d: %w", i, err)
			writeError(t.w, http.StatusInternalServerError, "api_error", "Could not prepare the upstream request")
			return outcomeFailed
		}
		t.items[i] = c
	}
	t.part = pool.Partition{Model: t.turn.Model, Effort: t.turn.Effort, PromptCacheKey: t.turn.PromptCacheKey}
	key, err := s.cfg.Router.Route(ctx, s.pool, t.part, t.items)
	if err != nil {
		if ctx.Err() != nil {
			return t.ctxEnded(ctx)
		}
		t.w.err = fmt.Errorf("choose the upstream account: %w", err)
		t.writeUpstreamError(retry.CredentialFailure(err, ""))
		return outcomeFailed
	}
	t.part.Account = key
	if t.span.IsRecording() {
		t.span.SetAttributes(attribute.String("clodex.account.key", key))
	}
	if t.turn.Stream {
		t.sse = translate.NewSSE(t.w)
	}

	err = retry.Do(ctx, retry.Config{Budget: s.cfg.Budgets.For(key), Clock: s.cfg.RetryClock, Rand: s.rand, Logger: s.cfg.Logger,
		Health: s.cfg.Health, Upstream: s.cfg.Upstream, Account: key}, t.attempt)
	if t.pending != nil {
		t.pending.Discard(t.pendingReason)
		t.pending = nil
	}
	if err == nil {
		return t.outcome
	}
	return t.finish(ctx, err)
}

// finish reports the error that ended the turn.
func (t *turnRun) finish(ctx context.Context, err error) string {
	if errors.Is(err, errClientGone) {
		t.w.err = err
		return outcomeClientGone
	}
	var te *retry.TimeoutError
	if !errors.As(err, &te) && ctx.Err() != nil {
		return t.ctxEnded(ctx)
	}
	t.w.err = err
	return t.fail(t.upstreamError(err))
}

// upstreamError maps the error retry.Do returned to what the client sees
// (retry.Classify, the failure table).
func (t *turnRun) upstreamError(err error) *retry.UpstreamError {
	var te *retry.TimeoutError
	var ue *retry.UpstreamError
	switch {
	case errors.As(err, &te):
		return te.Upstream()
	case errors.As(err, &ue):
		return ue
	}
	ue, _ = retry.Classify(err, t.facts(false)).Err.(*retry.UpstreamError)
	return ue
}

// facts are what the failure table is told about this turn's attempt.
func (t *turnRun) facts(reused bool) retry.Facts {
	return retry.Facts{AuthRefreshed: t.refreshed, Reused: reused, Upstream: t.s.cfg.Upstream, Now: t.s.now()}
}

// attempt is one retry.Do attempt: get a socket (continuation, new or
// replacement), send the turn, stream the response.
func (t *turnRun) attempt(ctx context.Context, a retry.Attempt) error {
	t.attempts++
	ctx, span := t.s.tracer.Start(ctx, "Gateway.Attempt")
	defer span.End()
	recording := span.IsRecording() // no attribute work for a no-op tracer
	if recording {
		span.SetAttributes(
			attribute.Int("clodex.attempt", a.N),
			attribute.Bool("clodex.attempt.replacement", a.Replacement),
			attribute.Int64("clodex.attempt.waited_ms", a.Waited.Milliseconds()),
		)
		span.SetAttributes(attribute.String("clodex.account.key", t.part.Account))
	}
	lease, err := t.obtain(ctx, a)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "no socket")
		return err
	}
	if recording {
		span.SetAttributes(
			attribute.Bool("clodex.socket.reused", lease.Reused),
			attribute.String("clodex.pool.decision", lease.Decision),
			attribute.String("clodex.pool.generation", lease.Generation),
			attribute.Int("clodex.pool.delta", lease.Delta),
		)
	}
	err = t.drive(ctx, a, lease)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "attempt failed")
	}
	return err
}

// obtain returns the attempt's lease: the pending lease's replacement on
// a replacement attempt, else a lease from Acquire. A 401 on the upgrade
// is answered once per turn by Router.Rejected and a new Acquire.
func (t *turnRun) obtain(ctx context.Context, a retry.Attempt) (*pool.Lease, error) {
	s := t.s
	if l := t.pending; l != nil {
		t.pending = nil
		if a.Replacement {
			nl, err := l.Replace(ctx, t.pendingReason)
			switch {
			case err == nil:
				s.metrics.dials.WithLabelValues("ok").Inc()
				t.newSockets, t.refused = t.newSockets+1, false
				return nl, nil
			case !errors.Is(err, pool.ErrReplaceSpent):
				return nil, t.dialFailure(ctx, err)
			}
		}
		l.Discard(t.pendingReason)
	}
	for {
		l, err := s.pool.Acquire(ctx, t.part, t.items)
		if err == nil {
			if !l.Reused {
				s.metrics.dials.WithLabelValues("ok").Inc()
				t.newSockets++
			}
			t.refused = false
			return l, nil
		}
		var rej *upstream.UpgradeError
		if errors.As(err, &rej) && rej.Status == http.StatusUnauthorized && !t.refreshed && ctx.Err() == nil {
			if ferr := t.refresh(ctx, rej.Token); ferr != nil {
				return nil, ferr
			}
			continue
		}
		return nil, t.dialFailure(ctx, err)
	}
}

// refresh reports a rejected token once per turn and drops the account's
// heads (they were opened with the rejected credential).
func (t *turnRun) refresh(ctx context.Context, token codexauth.Secret) error {
	t.refreshed = true
	t.s.pool.DropAccount(t.part.Account)
	t.span.AddEvent("credential rejected; refreshing")
	if _, err := t.s.cfg.Router.Rejected(ctx, t.part.Account, token); err != nil {
		if ctx.Err() != nil {
			return err
		}
		return retry.Final(retry.CredentialFailure(fmt.Errorf("refresh rejected credential: %w", err),
			"The upstream rejected the ChatGPT credential and it could not be refreshed"))
	}
	return nil
}

// dialFailure classifies a failed Acquire or Replace (retry.Classify) and
// counts it.
func (t *turnRun) dialFailure(ctx context.Context, err error) error {
	s := t.s
	if ctx.Err() != nil {
		s.metrics.dials.WithLabelValues("error").Inc()
		return err
	}
	f := retry.Classify(err, t.facts(false))
	t.refused = f.Kind == retry.KindPacer
	switch {
	case f.Kind == retry.KindPacer:
		s.metrics.dials.WithLabelValues("refused").Inc()
		s.metrics.pacerRefusals.Inc()
	case f.Kind == retry.KindDown:
		// No dial was made: the client is answered at once and retries.
		s.metrics.dials.WithLabelValues("skipped").Inc()
	case f.Status != 0:
		s.metrics.dials.WithLabelValues("refused").Inc()
	default:
		s.metrics.dials.WithLabelValues("error").Inc()
	}
	if f.Status != 0 {
		trace.SpanFromContext(ctx).SetAttributes(attribute.Int("clodex.upstream.status", f.Status))
	}
	return f
}

// endLease ends a failed attempt's lease: a Replace-class failure keeps it
// for the next attempt to replace; anything else discards it.
func (t *turnRun) endLease(l *pool.Lease, f *retry.Failure, reason, replaceReason string) {
	if f != nil && f.Class == retry.Replace {
		t.pending, t.pendingReason = l, replaceReason
		return
	}
	l.Discard(reason)
}

// clientSawOutput reports whether anything reached the client: after that
// the turn's failure can only be an SSE error event.
func (t *turnRun) clientSawOutput() bool {
	return t.sse != nil && t.sse.Started()
}

// clientSawContent reports whether the client got something it keeps (a
// delta, a tool call): after that nothing is retried. message_start, empty
// blocks and pings alone do not count: a retry continues the same message
// (translate.Stream.Resume).
func (t *turnRun) clientSawContent() bool {
	return t.clientSawOutput() && !t.stream.Resumable()
}

// drive is one attempt on the lease's socket, in order: start the
// attempt's translation, send the turn, then stream the response
// downstream until it ends. However it ends, drive ends the lease: a
// completed response keeps the socket as the conversation's head; a
// failure is classified for retry.Do (see the *Failed methods below) and
// the lease is discarded, or kept for the next attempt to replace.
func (t *turnRun) drive(ctx context.Context, a retry.Attempt, l *pool.Lease) error {
	if err := t.startStream(); err != nil {
		return t.clientFailed(l, err)
	}
	t.stream.SetCachedPrefix(int(l.CachedTokens))
	if err := t.send(ctx, l); err != nil {
		return err
	}
	return t.receive(ctx, a, l)
}

// startStream starts the attempt's translation: SSE straight to the
// client for a streaming request, else a collector for the JSON answer. A
// retry after an attempt that only began the message (message_start, an
// empty block) continues it. The error is a write error (client gone).
func (t *turnRun) startStream() error {
	if t.sse != nil && t.sse.Started() && t.stream != nil {
		next, err := t.stream.Resume()
		if err != nil {
			return err
		}
		t.stream = next
		return nil
	}
	if t.sse != nil {
		t.stream = translate.NewSSEStream(t.turn, t.sse, t.msgID)
		return nil
	}
	t.collector = translate.NewCollector()
	t.stream = translate.NewStream(t.turn, t.collector, t.msgID)
	return nil
}

// send renders the turn's response.create for the lease (a continuation
// sends previous_response_id and only the new items) and sends it.
func (t *turnRun) send(ctx context.Context, l *pool.Lease) error {
	frame, err := t.turn.CreateFrame(l.PreviousResponseID, t.turn.Input[l.Delta:])
	if err != nil {
		l.Discard(reasonFailed)
		return retry.Final(fmt.Errorf("render response.create: %w", err))
	}
	if err := l.Conn.Send(ctx, frame); err != nil {
		// Nothing the client keeps reached it yet: an earlier attempt
		// that wrote content ended the turn.
		return t.transportFailed(ctx, l, fmt.Errorf("send response.create: %w", err))
	}
	return nil
}

// receive streams the response: one upstream event at a time, as the
// socket's reader hands it over (Conn.Frames), is translated and written
// downstream, and a committed stream is pinged while the backend works
// without producing output. It returns when the response completes or
// fails, the socket or the client fails, or the turn's context ends.
func (t *turnRun) receive(ctx context.Context, a retry.Attempt, l *pool.Lease) error {
	frames := l.Conn.Frames()
	p := t.startPinger()
	defer p.stop()
	for {
		select {
		case data, ok := <-frames:
			if !ok {
				return t.transportFailed(ctx, l, fmt.Errorf("read upstream: %w", l.Conn.Err()))
			}
			a.Idle.Reset()
			p.sawUpstream()
			state, err := t.stream.Handle(data) // one flush per upstream event
			if err != nil {
				// The response goes on upstream; the socket cannot be
				// reused mid-response.
				return t.clientFailed(l, err)
			}
			switch state {
			case translate.StateCompleted:
				t.completeLease(l)
				t.outcome = t.complete()
				return nil
			case translate.StateFailed:
				return t.responseFailed(ctx, l, data)
			}
		case now := <-p.c():
			if p.due(now, t.sse.LastWrite()) {
				if _, err := t.stream.Ping(); err != nil {
					return t.clientFailed(l, err)
				}
			}
		case <-ctx.Done():
			return t.cancelled(ctx, l)
		}
	}
}

// The ways an attempt fails, each ending the lease. Only the
// classification (a *retry.Failure) decides whether retry.Do tries again;
// after output reached the client every failure is final.

// cancelled ends an attempt whose turn's context ended (client gone,
// shutdown, a deadline): the socket is discarded, and the cause is
// returned for retry.Do and finish to report.
func (t *turnRun) cancelled(ctx context.Context, l *pool.Lease) error {
	l.Discard(t.cancelReason(ctx))
	return context.Cause(ctx)
}

// transportFailed ends an attempt whose socket failed (a send or a read,
// the backend closed it): the socket is closed. Before output it is a
// transport failure: a reused socket is replaced at once, a new one backs
// off (retry.Transport); after output it is final.
func (t *turnRun) transportFailed(ctx context.Context, l *pool.Lease, err error) error {
	if ctx.Err() != nil {
		return t.cancelled(ctx, l)
	}
	if t.clientSawContent() {
		l.Discard(pool.DiscardSocketFailed)
		return retry.Final(err)
	}
	f := retry.Classify(err, t.facts(l.Reused))
	t.endLease(l, f, pool.DiscardSocketFailed, pool.ReplaceTransport)
	return f
}

// clientFailed ends an attempt whose client stopped reading: final.
func (t *turnRun) clientFailed(l *pool.Lease, err error) error {
	l.Discard(reasonClientGone)
	return retry.Final(fmt.Errorf("write downstream: %w: %w", errClientGone, err))
}

// responseFailed ends an attempt whose response failed upstream
// (response.failed, or an error event), frame being the event that failed
// it. Before output it is classified (retry.Classify: replace, back off,
// wait for a reset, or final); a 401 also drops the account's heads,
// opened with the rejected credential. A frame that ended the response
// leaves a healthy socket: it is kept (Lease.Release, docs/pool.md §7.1)
// for the retry and the next turn to resend the conversation on, unless
// the failure table says otherwise (a rejected credential, a failure
// whose fix is a new socket).
func (t *turnRun) responseFailed(ctx context.Context, l *pool.Lease, frame []byte) error {
	uf := t.stream.Failure()
	trace.SpanFromContext(ctx).SetAttributes(attribute.Int("clodex.upstream.status", uf.Status))
	ended := retry.EndsResponse(frame)
	if t.clientSawContent() {
		if ended && retry.KeepsSocket(uf) {
			l.Release()
		} else {
			l.Discard(reasonFailed)
		}
		return retry.Final(uf)
	}
	facts := t.facts(l.Reused)
	facts.ResponseEnded = ended
	f := retry.Classify(uf, facts)
	if uf.Status == http.StatusUnauthorized {
		t.s.pool.DropAccount(t.part.Account)
	}
	if f.KeepSocket {
		l.Release()
		return f
	}
	t.endLease(l, f, reasonFailed, replaceReason(uf.Code))
	return f
}

// replaceReason is the Lease.Replace reason of a response that failed with
// code.
func replaceReason(code string) string {
	switch code {
	case retry.CodePreviousResponseNotFound:
		return pool.ReplacePreviousResponseNotFound
	case retry.CodeConnectionLimit:
		return pool.ReplaceConnectionLimit
	}
	return pool.ReplaceTransport
}

// pinger paces the ping events of a committed stream: at each tick it asks
// for a ping when nothing went downstream since the previous tick while
// the backend is still sending (e.g. a long tool call whose arguments are
// buffered). A non-streaming request has no pinger: its channel is nil.
type pinger struct {
	ticker       *time.Ticker // nil for a non-streaming request
	interval     time.Duration
	lastTick     time.Time
	lastUpstream time.Time
}

func (t *turnRun) startPinger() *pinger {
	p := &pinger{interval: t.s.cfg.PingInterval}
	if t.sse != nil {
		p.ticker = time.NewTicker(p.interval)
		p.lastTick = time.Now()
	}
	return p
}

// c is the tick channel (nil, never ready, without a ticker).
func (p *pinger) c() <-chan time.Time {
	if p.ticker == nil {
		return nil
	}
	return p.ticker.C
}

// sawUpstream notes an upstream event.
func (p *pinger) sawUpstream() {
	if p.ticker != nil {
		p.lastUpstream = time.Now()
	}
}

// due reports, at the tick now, whether to ping, given the time of the
// last downstream write.
func (p *pinger) due(now, lastWrite time.Time) bool {
	due := !lastWrite.After(p.lastTick) && now.Sub(p.lastUpstream) < p.interval
	p.lastTick = now
	return due
}

func (p *pinger) stop() {
	if p.ticker != nil {
		p.ticker.Stop()
	}
}

// completeLease keeps the socket as the conversation's head.
func (t *turnRun) completeLease(l *pool.Lease) {
	out := t.stream.OutputItems()
	items := make([][]byte, len(out))
	for i, it := range out {
		items[i] = it
	}
	u := t.stream.Usage()
	l.Complete(t.stream.ResponseID(), items, pool.Usage{
		InputTokens:  int64(u.InputTokens + u.CacheReadInputTokens + u.CacheCreationInputTokens),
		CachedTokens: int64(u.CacheReadInputTokens),
		OutputTokens: int64(u.OutputTokens),
	})
}

func (t *turnRun) cancelReason(ctx context.Context) string {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errShuttingDown):
		return reasonShutdown
	case errors.Is(cause, retry.ErrIdleTimeout):
		return reasonIdle
	case errors.Is(cause, retry.ErrTotalTimeout):
		return reasonTotal
	default:
		return reasonClientGone
	}
}

// complete ends a completed response downstream.
func (t *turnRun) complete() string {
	if err := t.stream.Finish(); err != nil { // the closing events go out in one flush
		t.w.err = fmt.Errorf("write downstream: %w", err)
		return outcomeClientGone
	}
	if t.collector != nil {
		msg, err := t.collector.Message()
		if err != nil {
			t.w.err = err
			t.writeUpstreamError(&retry.UpstreamError{Status: http.StatusBadGateway, Type: "api_error",
				Message: "The upstream response could not be assembled into a message"})
			return outcomeFailed
		}
		writeJSON(t.w, http.StatusOK, msg)
	}
	if t.span.IsRecording() {
		t.span.SetAttributes(attribute.String("clodex.upstream.response_id", t.stream.ResponseID()))
	}
	return outcomeCompleted
}

// fail reports f: an SSE error event after output, else a real status.
func (t *turnRun) fail(f *retry.UpstreamError) string {
	if t.clientSawOutput() && t.stream != nil {
		if err := t.stream.Abort(f); err != nil {
			return outcomeClientGone
		}
		return outcomeFailed
	}
	t.writeUpstreamError(f)
	return outcomeFailed
}

// ctxEnded handles the end of the turn's context: a shutdown is reported
// to the client; a client that went away gets nothing.
func (t *turnRun) ctxEnded(ctx context.Context) string {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errShuttingDown):
		t.w.err = cause
		return t.fail(&retry.UpstreamError{Status: http.StatusServiceUnavailable, Type: "api_error",
			Message: "The data plane is shutting down; retry the request"})
	default:
		t.w.err = fmt.Errorf("client went away: %w", cause)
		return outcomeClientGone
	}
}

// writeUpstreamError answers a failure that happened before any output
// with its classified status, body and retry headers (retry.Answer, docs/errors.md §8):
// every failure a retry can fix gets retry-after and x-should-retry: true
// and says when to retry; x-should-retry: false where a retry cannot help.
// Never an empty 200.
func (t *turnRun) writeUpstreamError(f *retry.UpstreamError) {
	f = retry.Overflow(f, t.turn.ContextWindow, t.turn.EstimatedInputTokens)
	if f.Status == http.StatusInternalServerError || f.Status < 400 || f.Status > 599 {
		c := *f
		c.Status = http.StatusBadGateway
		f = &c
	}
	f = retry.Answer(t.w.Header(), f, retry.Facts{AuthRefreshed: t.refreshed, Now: t.s.now(),
		Wait: t.s.cfg.Health.RetryAfterAccount(t.s.cfg.Upstream, t.part.Account)}, t.s.rand)
	writeJSON(t.w, f.Status, retry.ErrorBody(f))
}
