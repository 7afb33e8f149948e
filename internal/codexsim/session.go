package codexsim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/coder/websocket"
)

// session is one accepted socket. Its reader runs on the upgrade handler's
// goroutine (readLoop); each response runs on a goroutine the session owns
// and waits for.
type session struct {
	s       *Server
	conn    *websocket.Conn
	id      uint64
	account string
	created time.Time

	rec *SocketLog // nil unless Config.RecordFrames; guarded by s.recMu

	wg sync.WaitGroup // running response goroutines

	sendMu sync.Mutex // serialises writes; held across a response's terminal event

	mu       sync.Mutex // guards the following fields
	inFlight bool
	nResp    int // responses created on this socket
	nCalls   int // function calls emitted on this socket
	events   int // events sent on this socket
	held     map[string]heldResponse
	dropped  bool // the CloseAfterEvents fault fired
	closing  bool // CloseIdle is closing the socket: frames are ignored
}

// heldResponse is what the socket keeps of a completed response so it can
// be continued with previous_response_id.
type heldResponse struct {
	inputTokens  int64 // the response's input_tokens
	outputTokens int64
	chainItems   int64 // tokens of every item of the chain, outputs included
}

func newSession(s *Server, conn *websocket.Conn, id uint64, account string, now time.Time) *session {
	return &session{
		s: s, conn: conn, id: id, account: account, created: now,
		held: make(map[string]heldResponse),
	}
}

// closeIfIdle marks an idle socket as closing and reports whether it was
// idle (no response in flight).
func (ss *session) closeIfIdle() bool {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.inFlight || ss.closing {
		return false
	}
	ss.closing = true
	return true
}

// goAway closes the socket with 1001; readLoop then returns.
func (ss *session) goAway() {
	_ = ss.conn.Close(websocket.StatusGoingAway, "server shutting down")
}

// readLoop reads frames until the socket ends, then stops and waits for the
// session's response goroutine. ctx must not end with the upgrade request
// (the socket outlives it); responses run under a child of ctx that
// readLoop cancels when it returns.
func (ss *session) readLoop(ctx context.Context) {
	rctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		ss.wg.Wait()
		_ = ss.conn.CloseNow()
	}()
	for {
		typ, r, err := ss.conn.Reader(ctx)
		if err != nil {
			ss.recordClose(err)
			return
		}
		limit := ss.s.config().MaxFrameBytes
		data, over, err := readLimited(r, limit)
		if err != nil {
			ss.recordClose(err)
			return
		}
		if over {
			ss.sendError(rctx, invalidRequest("request_too_large", "", "frame exceeds the maximum of %d bytes; send a smaller response.create", limit))
			continue
		}
		ss.record(true, data)
		if typ != websocket.MessageText {
			ss.sendError(rctx, invalidRequest("invalid_json", "", "binary frames are not accepted; send response.create as a JSON text frame"))
			continue
		}
		ss.handleFrame(rctx, data)
	}
}

// readLimited reads a whole message; when it is longer than limit, the rest
// is discarded and over is true.
func readLimited(r io.Reader, limit int64) (data []byte, over bool, err error) {
	data, err = io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(data)) > limit {
		if _, err := io.Copy(io.Discard, r); err != nil {
			return nil, false, err
		}
		return nil, true, nil
	}
	return data, false, nil
}

// handleFrame answers one client frame: an error frame, or a response
// started on its own goroutine.
func (ss *session) handleFrame(ctx context.Context, data []byte) {
	ss.mu.Lock()
	closing := ss.closing
	ss.mu.Unlock()
	if closing {
		return // CloseIdle is ending the socket
	}
	req, werr := decodeFrame(data)
	if werr != nil {
		ss.sendError(ctx, werr)
		return
	}
	cfg := ss.s.config()
	var p *plan
	if req.Generate {
		text, toolOutput := newestText(req.Input)
		if p, werr = parsePlan(text, toolOutput); werr != nil {
			ss.sendError(ctx, werr)
			return
		}
		if req.Format != nil {
			p.structured = minimalInstance(req.Format)
		}
	}
	now := ss.s.clock()
	if reset, ok := ss.s.usageLimit(now); ok {
		ss.sendError(ctx, usageLimitError(cfg.Faults.UsageLimitPlan, reset.Sub(now), now))
		return
	}
	if reset, ok := ss.s.usage.limit(ss.account, cfg.Quota, now); ok && req.Generate {
		ss.s.count(func(st *Stats) { st.Errors["usage_limit_reached"]++ })
		ss.sendError(ctx, usageLimitError(cfg.Quota.Plan, reset.Sub(now), now))
		return
	}

	ss.mu.Lock()
	if ss.inFlight {
		ss.mu.Unlock()
		ss.sendError(ctx, invalidRequest("response_in_progress", "", "a response is already in progress on this connection; wait for its terminal event before sending another response.create"))
		return
	}
	if age := ss.s.clock().Sub(ss.created); age >= cfg.SocketLifetime {
		ss.mu.Unlock()
		ss.sendError(ctx, &wireError{Status: 400, Type: "invalid_request_error", Code: "websocket_connection_limit_reached",
			Message: fmt.Sprintf("Responses websocket connection limit reached (%s). Create a new websocket connection to continue.", lifetimeText(cfg.SocketLifetime))})
		return
	}
	var prev *heldResponse
	if req.PreviousResponseID != "" {
		h, ok := ss.held[req.PreviousResponseID]
		if !ok {
			ss.mu.Unlock()
			ss.s.count(func(st *Stats) { st.PreviousResponseNotFound++ })
			ss.sendError(ctx, invalidRequest("previous_response_not_found", "previous_response_id",
				"Previous response with id '%s' not found.", clip(req.PreviousResponseID, 80)))
			return
		}
		prev = &h
	}
	ss.inFlight = true
	ss.nResp++
	rid := fmt.Sprintf("resp_%08x%08x", ss.id, ss.nResp)
	ss.mu.Unlock()

	r := &response{ss: ss, cfg: cfg, req: req, plan: p, prev: prev, id: rid}
	ss.wg.Go(func() { r.run(ctx) })
}

// usageLimitError is the error frame of a reached plan usage limit that
// resets in resetsIn: status 429, code and type usage_limit_reached, with
// plan_type, resets_in_seconds (whole seconds, rounded up) and resets_at
// (Unix seconds), as the real backend sends it.
func usageLimitError(plan string, resetsIn time.Duration, now time.Time) *wireError {
	secs := int64((max(resetsIn, 0) + time.Second - 1) / time.Second)
	return &wireError{Status: 429, Type: "usage_limit_reached", Code: "usage_limit_reached",
		Message: "The usage limit has been reached",
		Extra:   obj{{"plan_type", plan}, {"resets_in_seconds", secs}, {"resets_at", now.Unix() + secs}}}
}

func lifetimeText(d time.Duration) string {
	if d%time.Minute == 0 {
		return fmt.Sprintf("%d minutes", int(d/time.Minute))
	}
	return d.String()
}

// sendError counts and sends an error frame.
func (ss *session) sendError(ctx context.Context, e *wireError) {
	ss.s.count(func(st *Stats) { st.Errors[e.Code]++ })
	ss.sendMu.Lock()
	defer ss.sendMu.Unlock()
	_ = ss.sendLocked(ctx, e.frame())
}

// sendLocked writes one event; the caller holds sendMu. It applies the
// CloseAfterEvents fault.
func (ss *session) sendLocked(ctx context.Context, ev obj) error {
	b := appendJSON(nil, ev)
	cfg := ss.s.config()
	ss.mu.Lock()
	if ss.dropped {
		ss.mu.Unlock()
		return errDropped
	}
	ss.mu.Unlock()
	ss.record(false, b) // before the write: a client that read it finds it logged
	// A write that makes no progress for WriteTimeout (a client that does
	// not read) ends: coder/websocket closes the socket when the write's
	// context ends, readLoop returns and the response stops.
	wctx, cancel := context.WithTimeout(ctx, cfg.WriteTimeout)
	err := ss.conn.Write(wctx, websocket.MessageText, b)
	cancel()
	if err != nil {
		if errors.Is(wctx.Err(), context.DeadlineExceeded) { // not ctx: readLoop cancels it once the socket is closed
			ss.s.count(func(st *Stats) { st.WriteTimeouts++ })
			ss.s.logger.Info("socket closed: the client read nothing for the write timeout", "socket", ss.id, "write_timeout", cfg.WriteTimeout)
			_ = ss.conn.CloseNow()
		}
		return fmt.Errorf("write event: %w", err)
	}
	ss.s.count(func(st *Stats) { st.Events++ })
	ss.mu.Lock()
	ss.events++
	drop := cfg.Faults.CloseAfterEvents > 0 && ss.events >= cfg.Faults.CloseAfterEvents
	if drop {
		ss.dropped = true
	}
	ss.mu.Unlock()
	if drop {
		_ = ss.conn.CloseNow()
		return errDropped
	}
	return nil
}

var errDropped = fmt.Errorf("socket dropped by the close_after_events fault")
