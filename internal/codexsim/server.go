package codexsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/clodex/clodex/internal/codexsim/simauth"
)

// Paths served by Handler.
const (
	ChatGPTPath = "/backend-api/codex/responses" // ChatGPT-style WebSocket endpoint
	APIKeyPath  = "/v1/responses"                // API-key-style WebSocket endpoint
	StatsPath   = "/sim/stats"
	ConfigPath  = "/sim/config"
	// CloseIdlePath closes an account's idle sockets (POST, a CloseIdleRequest).
	CloseIdlePath = "/sim/close-idle"
	// BetaHeaderValue is the OpenAI-Beta value every upgrade must carry.
	BetaHeaderValue = "responses_websockets=2026-02-06"
)

// Server is the emulated Codex Responses WebSocket backend. Create it with
// New, serve Handler, and call Close to end every socket.
type Server struct {
	clock    func() time.Time
	logger   *slog.Logger
	auth     *simauth.Authority
	throttle *throttle
	mux      *http.ServeMux
	wg       sync.WaitGroup // one per running upgrade handler (socket reader)

	mu       sync.Mutex // guards the following fields
	cfg      Config
	closed   bool
	sessions map[*session]struct{}
	nextID   uint64
	dials    uint64 // upgrades that reached the 5xx fault check
	// usageReset is when the usage limit of Faults.UsageLimitResetsIn
	// resets; zero when none was set.
	usageReset time.Time

	usage planUsage // plan usage per account (Config.Quota)

	statsMu sync.Mutex // guards stats
	stats   Stats

	recMu   sync.Mutex // guards records, recSeq and the logs records points to
	records []*SocketLog
	recSeq  uint64
}

// New validates cfg (every bad value is named) and returns a Server.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("codexsim config: %w", err)
	}
	cfg = cfg.withDefaults()
	s := &Server{
		clock:    cfg.Clock,
		logger:   cfg.Logger,
		auth:     cfg.Auth,
		throttle: newThrottle(),
		cfg:      cfg,
		sessions: make(map[*session]struct{}),
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	s.logger = s.logger.With("component", "codexsim")
	if cfg.Faults.UsageLimitResetsIn > 0 {
		s.usageReset = s.clock().Add(cfg.Faults.UsageLimitResetsIn)
	}
	s.stats.init()
	s.mux = s.routes()
	return s, nil
}

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ChatGPTPath, func(w http.ResponseWriter, r *http.Request) { s.serveUpgrade(w, r, true) })
	mux.HandleFunc("GET "+APIKeyPath, func(w http.ResponseWriter, r *http.Request) { s.serveUpgrade(w, r, false) })
	mux.HandleFunc("GET "+StatsPath, s.serveStats)
	mux.HandleFunc("GET "+ConfigPath, s.serveConfig)
	mux.HandleFunc("POST "+ConfigPath, s.serveConfig)
	mux.HandleFunc("POST "+CloseIdlePath, s.serveCloseIdle)
	authPaths := []string{"/oauth/token", "/api/accounts/deviceauth/", "/codex/device", "/backend-api/wham/accounts/check"}
	for _, p := range authPaths {
		if s.auth != nil {
			mux.Handle(p, s.auth.Handler())
			continue
		}
		mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			httpError(w, http.StatusNotFound, "not_found", "the OAuth emulator is off on this server")
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpError(w, http.StatusNotFound, "not_found", fmt.Sprintf("unknown endpoint %s %s", r.Method, r.URL.Path))
	})
	return mux
}

// Handler serves every route: the two WebSocket endpoints, /sim/stats,
// /sim/config, /sim/close-idle and, with Config.Auth, the OAuth emulator's
// endpoints.
func (s *Server) Handler() http.Handler { return s.mux }

// config returns the running configuration.
func (s *Server) config() Config {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cfg
}

// SetConfig changes the running configuration (what POST /sim/config does).
// Fields absent from patch keep their values. A bad value changes nothing.
func (s *Server) SetConfig(patch ConfigPatch) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	next, err := patch.apply(s.cfg)
	if err != nil {
		return fmt.Errorf("set config: %w", err)
	}
	if patch.TokenTTL != nil {
		s.auth.SetTokenTTL(time.Duration(*patch.TokenTTL))
	}
	if patch.UsageLimitResetsIn != nil {
		s.usageReset = time.Time{}
		if next.Faults.UsageLimitResetsIn > 0 {
			s.usageReset = s.clock().Add(next.Faults.UsageLimitResetsIn)
		}
	}
	s.cfg = next
	return nil
}

// usageLimit returns when the running usage limit resets, and whether one
// is in force at now.
func (s *Server) usageLimit(now time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usageReset, !s.usageReset.IsZero() && now.Before(s.usageReset)
}

// DropSockets drops every open socket at once, without a close frame, as a
// backend that crashed would: clients see the connection end (1006). The
// server keeps serving new upgrades. It returns how many sockets it dropped.
func (s *Server) DropSockets() int {
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	for _, sess := range sessions {
		_ = sess.conn.CloseNow()
	}
	return len(sessions)
}

// Close ends every open socket with status 1001 (going away), waits for
// their goroutines, and makes later upgrades answer 503. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	sessions := make([]*session, 0, len(s.sessions))
	for sess := range s.sessions {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	var closers sync.WaitGroup
	for _, sess := range sessions {
		closers.Go(func() { sess.goAway() })
	}
	closers.Wait()
	s.wg.Wait()
	return nil
}

func httpError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	typ := "invalid_request_error"
	switch {
	case status == http.StatusUnauthorized:
		typ = "authentication_error"
	case status == http.StatusForbidden:
		typ = "permission_error"
	case status >= 500:
		typ = "server_error"
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": typ, "code": code, "message": msg}})
}

// bearer extracts the token of an Authorization: Bearer header.
func bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

// errNoBearer reports an upgrade without an Authorization: Bearer header.
var errNoBearer = errors.New("missing bearer token")

// authenticate returns the account of the request's bearer token, or why
// it is refused: errNoBearer, or a simauth.ErrExpired / ErrInvalid error.
func (s *Server) authenticate(r *http.Request, cfg Config) (string, error) {
	tok, ok := bearer(r)
	if !ok {
		return "", errNoBearer
	}
	if acct, ok := cfg.AcceptTokens[tok]; ok {
		return acct, nil
	}
	if s.auth != nil {
		return s.auth.Validate(tok)
	}
	return "", simauth.ErrInvalid
}

// writeUnauthorized answers a refused bearer token.
func writeUnauthorized(w http.ResponseWriter, err error) {
	if errors.Is(err, errNoBearer) {
		httpError(w, http.StatusUnauthorized, "missing_authorization", "missing bearer token; send Authorization: Bearer <access token>")
		return
	}
	simauth.WriteUnauthorized(w, err)
}

// hasBeta reports whether the request carries the Responses WebSocket beta.
func hasBeta(r *http.Request) bool {
	for _, v := range r.Header.Values("OpenAI-Beta") {
		for _, part := range strings.Split(v, ",") {
			if strings.TrimSpace(part) == BetaHeaderValue {
				return true
			}
		}
	}
	return false
}

func headerHasToken(r *http.Request, name, token string) bool {
	for _, v := range r.Header.Values(name) {
		for _, part := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(part), token) {
				return true
			}
		}
	}
	return false
}

// serveUpgrade runs the checks in order (token, account header, beta
// header, 5xx fault, throttle), accepts the WebSocket and serves it.
func (s *Server) serveUpgrade(w http.ResponseWriter, r *http.Request, chatgpt bool) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		httpError(w, http.StatusServiceUnavailable, "server_shutting_down", "clodex-sim is shutting down")
		return
	}
	s.wg.Add(1)
	cfg := s.cfg
	s.mu.Unlock()
	defer s.wg.Done()

	account, err := s.authenticate(r, cfg)
	if err != nil {
		s.count(func(st *Stats) { st.Upgrade401s++ })
		writeUnauthorized(w, err)
		return
	}
	hdr := strings.TrimSpace(r.Header.Get("chatgpt-account-id"))
	switch {
	case chatgpt && hdr == "":
		s.count(func(st *Stats) { st.Upgrade401s++ })
		httpError(w, http.StatusUnauthorized, "missing_account_id", "missing chatgpt-account-id header; send the account id of the token")
		return
	case hdr != "" && hdr != account:
		s.count(func(st *Stats) { st.Upgrade401s++ })
		httpError(w, http.StatusUnauthorized, "account_mismatch", "the chatgpt-account-id header does not match the token's account")
		return
	}
	if !hasBeta(r) {
		s.count(func(st *Stats) { st.Upgrade400s++ })
		httpError(w, http.StatusBadRequest, "missing_beta_header", "missing OpenAI-Beta: "+BetaHeaderValue)
		return
	}
	if !headerHasToken(r, "Upgrade", "websocket") || !headerHasToken(r, "Connection", "upgrade") {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "websocket")
		httpError(w, http.StatusUpgradeRequired, "websocket_required", "this endpoint only serves WebSocket upgrades")
		return
	}
	if status, fail := s.upgradeFault(cfg); fail {
		s.count(func(st *Stats) { st.Upgrade5xxs++ })
		httpError(w, status, "server_error", fmt.Sprintf("injected upgrade failure (HTTP %d)", status))
		return
	}
	now := s.clock()
	if rej := s.throttle.admit(account, now, limits{
		upgradeLimit:   cfg.UpgradeLimit,
		window:         cfg.UpgradeWindow,
		countRejected:  cfg.CountRejected,
		instantLimit:   cfg.InstantLimit,
		maxOpenSockets: cfg.MaxOpenSockets,
	}); rej != rejectNone {
		s.count(func(st *Stats) { st.Upgrade403s++ })
		s.logger.DebugContext(r.Context(), "upgrade throttled", "account", account, "reason", string(rej))
		if cfg.Faults.RetryAfter403 > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(cfg.Faults.RetryAfter403.Seconds()))))
		}
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte("<html><body><h1>403 Forbidden</h1></body></html>\n"))
		return
	}
	// Count before the 101 goes out, so a client that reads the stats
	// right after its dial returns sees its upgrade.
	s.count(func(st *Stats) {
		st.Upgrades++
		st.UpgradesByAccount[account]++
		st.OpenSockets++
	})
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		s.count(func(st *Stats) {
			st.Upgrades--
			st.UpgradesByAccount[account]--
			st.OpenSockets--
		})
		s.throttle.release(account)
		s.logger.DebugContext(r.Context(), "websocket accept", "err", err)
		return
	}
	conn.SetReadLimit(-1) // the session enforces MaxFrameBytes itself
	ctx := context.WithoutCancel(r.Context())
	s.mu.Lock()
	s.nextID++
	sess := newSession(s, conn, s.nextID, account, now)
	sess.rec = s.newRecord(sess.id, account, cfg.RecordFrames)
	if s.closed {
		s.mu.Unlock()
		s.throttle.release(account)
		s.count(func(st *Stats) { st.OpenSockets-- })
		_ = conn.Close(websocket.StatusGoingAway, "server shutting down")
		return
	}
	s.sessions[sess] = struct{}{}
	s.mu.Unlock()
	s.logger.DebugContext(r.Context(), "socket open", "socket", sess.id, "account", account)

	sess.readLoop(ctx)

	s.mu.Lock()
	delete(s.sessions, sess)
	s.mu.Unlock()
	s.throttle.release(account)
	s.count(func(st *Stats) { st.OpenSockets-- })
	s.logger.DebugContext(ctx, "socket closed", "socket", sess.id)
}

// upgradeFault decides whether this upgrade gets an injected 5xx.
func (s *Server) upgradeFault(cfg Config) (int, bool) {
	share := cfg.Faults.Upgrade5xxShare
	if share <= 0 {
		return 0, false
	}
	s.mu.Lock()
	s.dials++
	n := s.dials
	s.mu.Unlock()
	if math.Floor(float64(n)*share) > math.Floor(float64(n-1)*share) {
		return cfg.Faults.Upgrade5xxStatus, true
	}
	return 0, false
}

func (s *Server) serveStats(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.Stats())
}

func (s *Server) serveConfig(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			httpError(w, http.StatusBadRequest, "invalid_config", "config patch: the body could not be read or is over 1 MiB")
			return
		}
		p, err := decodePatch(body)
		if err != nil {
			httpError(w, http.StatusBadRequest, "invalid_config", "config patch: "+err.Error())
			return
		}
		if err := s.SetConfig(p); err != nil {
			httpError(w, http.StatusBadRequest, "invalid_config", err.Error())
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	now := s.clock()
	s.mu.Lock()
	cfg, reset := s.cfg, s.usageReset
	s.mu.Unlock()
	var ttl time.Duration
	if s.auth != nil {
		ttl = s.auth.TokenTTL()
	}
	_ = enc.Encode(viewOf(cfg, reset, now, ttl))
}

// CloseIdleRequest is the body of POST /sim/close-idle and the argument of
// [Server.CloseIdle].
type CloseIdleRequest struct {
	// Account is the account whose idle sockets close (Required).
	Account string `json:"account"`
	// Code is the close frame's status (Optional; default 1000). Allowed:
	// 1000-1003, 1007-1014 and 3000-4999.
	Code int `json:"code,omitempty"`
	// Reason is the close frame's reason (Optional; default "idle
	// connection closed"; at most 123 bytes).
	Reason string `json:"reason,omitempty"`
	// Drop ends the sockets without a close frame, as a server that
	// crashed or a proxy that gave up would: the client's read fails with
	// no close status (Optional).
	Drop bool `json:"drop,omitempty"`
}

const defaultIdleCloseReason = "idle connection closed"

func (r CloseIdleRequest) validate() error {
	var errs []error
	if r.Account == "" {
		errs = append(errs, errors.New("account is required: the account whose idle sockets close"))
	}
	if c := r.Code; c != 0 && !(c >= 1000 && c <= 1003 || c >= 1007 && c <= 1014 || c >= 3000 && c <= 4999) {
		errs = append(errs, fmt.Errorf("code %d cannot be sent in a close frame; allowed: 1000-1003, 1007-1014, 3000-4999", c))
	}
	if len(r.Reason) > 123 {
		errs = append(errs, fmt.Errorf("reason is %d bytes; allowed: at most 123", len(r.Reason)))
	}
	if r.Drop && (r.Code != 0 || r.Reason != "") {
		errs = append(errs, errors.New("drop sends no close frame; leave code and reason out"))
	}
	return errors.Join(errs...)
}

// CloseIdle closes every open socket of req.Account that has no response
// in flight, as a backend that ends idle connections would: with a close
// frame (req.Code, req.Reason), or, with req.Drop, without one. A frame
// that arrives on such a socket meanwhile is ignored. It returns how many
// sockets it closed, once their close handshakes ended (each bounded by
// coder/websocket's 5 s per step).
func (s *Server) CloseIdle(req CloseIdleRequest) (int, error) {
	if err := req.validate(); err != nil {
		return 0, fmt.Errorf("close idle sockets: %w", err)
	}
	code, reason := websocket.StatusCode(req.Code), req.Reason
	if code == 0 {
		code = websocket.StatusNormalClosure
	}
	if reason == "" {
		reason = defaultIdleCloseReason
	}
	s.mu.Lock()
	var idle []*session
	for sess := range s.sessions {
		if sess.account == req.Account && sess.closeIfIdle() {
			idle = append(idle, sess)
		}
	}
	s.mu.Unlock()
	s.count(func(st *Stats) { st.IdleSocketsClosed += int64(len(idle)) })
	var closers sync.WaitGroup
	for _, sess := range idle {
		closers.Go(func() {
			if req.Drop {
				_ = sess.conn.CloseNow()
				return
			}
			_ = sess.conn.Close(code, reason)
		})
	}
	closers.Wait()
	s.logger.Debug("idle sockets closed", "account", req.Account, "sockets", len(idle), "drop", req.Drop)
	return len(idle), nil
}

func (s *Server) serveCloseIdle(w http.ResponseWriter, r *http.Request) {
	var req CloseIdleRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, "invalid_request", "close-idle request is invalid: "+clip(err.Error(), 300)+
			`; want {"account": ACCOUNT, "code": N, "reason": TEXT, "drop": BOOL}`)
		return
	}
	n, err := s.CloseIdle(req)
	if err != nil {
		httpError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]int{"closed": n})
}
