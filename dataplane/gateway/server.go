package gateway

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/clodex/clodex/dataplane/pool"
	"github.com/clodex/clodex/dataplane/translate"
	"github.com/clodex/clodex/internal/hostcheck"
	"github.com/clodex/clodex/internal/jsonstr"
)

// Log keys shared by the gateway's log lines.
const (
	keyRequestID = "request_id"
	keyMethod    = "method"
	keyPath      = "path"
	keyStatus    = "status"
	keyDuration  = "duration"
	keyModel     = "model"
	keyErr       = "err"
	keyOutcome   = "outcome"
	keyAttempts  = "attempts"
	keyMember    = "member"
)

// Server is the data plane's Anthropic API. Create it with New.
type Server struct {
	cfg      Config // immutable after New
	loopback bool
	origins  map[string]bool // AllowedOrigins, normalised
	keyHash  [sha256.Size]byte
	mux      *http.ServeMux
	models   []byte // GET /v1/models body
	modelIDs map[string][]byte
	tracer   trace.Tracer
	metrics  *metrics
	pool     *pool.Pool
	rand     func() float64

	// bg counts tracked turns until their socket is released (closes run
	// in the background); Close waits for it. Add happens under mu while
	// !closed, so no Add races with Wait.
	bg sync.WaitGroup

	mu     sync.Mutex // guards the following fields
	turns  map[*turnHandle]struct{}
	closed bool
}

// turnHandle lets Close cancel an in-flight turn.
type turnHandle struct{ cancel context.CancelCauseFunc }

// New checks cfg and returns a Server. Every bad field is named in the
// error.
func New(cfg Config) (*Server, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		loopback: IsLoopbackAddr(cfg.ListenAddr),
		turns:    make(map[*turnHandle]struct{}),
	}
	s.origins = make(map[string]bool, len(cfg.AllowedOrigins))
	for _, o := range cfg.AllowedOrigins {
		n, _ := hostcheck.NormalizeOrigin(o) // validate checked them
		s.origins[n] = true
	}
	s.keyHash = sha256.Sum256([]byte(cfg.APIKey))
	tp := cfg.TracerProvider
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	s.tracer = tp.Tracer("github.com/clodex/clodex/dataplane/gateway")
	m, err := newMetrics(cfg.Registry)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.models, s.modelIDs = renderModels(cfg.Models.List())
	s.rand = cfg.RetryRand
	if s.rand == nil {
		s.rand = rand.Float64
	}
	s.pool = cfg.Pool
	s.mux = http.NewServeMux()
	s.mux.Handle("POST /v1/messages", s.authed(s.serveMessages))
	s.mux.Handle("POST /v1/messages/count_tokens", s.authed(s.serveCountTokens))
	s.mux.Handle("GET /v1/models", s.authed(s.serveModels))
	s.mux.Handle("GET /v1/models/{id...}", s.authed(s.serveModel))
	s.mux.Handle("GET /healthz", routed(func(w *record, _ *http.Request) {
		// The service name tells a client probing the port (for example
		// `clodex-dataplane claude`) that it is a clodex data plane.
		writeJSON(w, http.StatusOK, []byte(`{"ok":true,"service":"clodex-dataplane"}`))
	}))
	s.mux.Handle("GET /readyz", routed(func(w *record, _ *http.Request) {
		if cfg.Ready != nil {
			if err := cfg.Ready(); err != nil {
				b := jsonstr.Append([]byte(`{"ok":false,"service":"clodex-dataplane","reason":`), err.Error())
				writeJSON(w, http.StatusServiceUnavailable, append(b, '}'))
				return
			}
		}
		writeJSON(w, http.StatusOK, []byte(`{"ok":true,"service":"clodex-dataplane"}`))
	}))
	s.mux.Handle("/", s.authed(func(w *record, r *http.Request) {
		writeError(w, http.StatusNotFound, "not_found_error", fmt.Sprintf("Unknown endpoint: %s %s", r.Method, r.URL.Path))
	}))
	return s, nil
}

// now is the time of the retry clock.
func (s *Server) now() time.Time {
	if s.cfg.RetryClock != nil {
		return s.cfg.RetryClock.Now()
	}
	return time.Now()
}

// Close cancels every in-flight turn (the client is told the data plane is
// shutting down; the socket is discarded with the reason "server shutting
// down", which closes it at once) and waits until every turn has released
// its socket. Call it after http.Server.Shutdown has given turns their
// grace period, and before closing the pool.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for h := range s.turns {
		h.cancel(errShuttingDown)
	}
	s.mu.Unlock()
	s.bg.Wait()
	return nil
}

var errShuttingDown = errors.New("server shutting down")

func (s *Server) track(cancel context.CancelCauseFunc) (*turnHandle, bool) {
	h := &turnHandle{cancel: cancel}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false
	}
	s.turns[h] = struct{}{}
	s.bg.Add(1) // released by the turn once its lease has ended
	return h, true
}

func (s *Server) untrack(h *turnHandle) {
	s.mu.Lock()
	delete(s.turns, h)
	s.mu.Unlock()
}

// Handler returns the API handler: listener checks, routing, one log line
// and one metric per request.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.serveHTTP) }

// record is the per-request state the boundary logs once.
type record struct {
	http.ResponseWriter
	status   int
	err      error  // the error behind a failure status, logged once
	model    string // requested model, when known
	member   string // the member whose key authenticated the request, when known
	failed   bool   // a turn that ended in an error the client saw (a status or an SSE error event)
	attempts int    // upstream attempts of a failed turn
}

func (r *record) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *record) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush on the real writer.
func (r *record) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &record{ResponseWriter: w}
	reqID := newID("req_")
	w.Header().Set("Request-Id", reqID)
	s.route(rec, r)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	s.metrics.requests.WithLabelValues(strconv.Itoa(rec.status)).Inc()
	level := slog.LevelDebug
	if r.Method == http.MethodPost {
		level = slog.LevelInfo
	}
	if rec.status >= 500 || rec.failed {
		level = slog.LevelWarn // operators see every turn that failed, and why
	}
	if !s.cfg.Logger.Enabled(r.Context(), level) {
		return
	}
	attrs := []slog.Attr{
		slog.String(keyRequestID, reqID),
		slog.String(keyMethod, r.Method),
		slog.String(keyPath, r.URL.Path),
		slog.Int(keyStatus, rec.status),
		slog.Duration(keyDuration, time.Since(start)),
	}
	if rec.model != "" {
		attrs = append(attrs, slog.String(keyModel, rec.model))
	}
	if rec.member != "" {
		attrs = append(attrs, slog.String(keyMember, rec.member))
	}
	if rec.err != nil {
		attrs = append(attrs, slog.String(keyErr, rec.err.Error()))
	}
	if rec.failed {
		attrs = append(attrs, slog.String(keyOutcome, outcomeFailed), slog.Int(keyAttempts, rec.attempts))
	}
	s.cfg.Logger.LogAttrs(r.Context(), level, "request", attrs...)
}

// route checks the listener's rules (Host and Origin), answers HEAD on any
// path (Claude Code's preconnect) and hands the request to its route; the
// routes but /healthz and /readyz need the key on a non-loopback listener.
func (s *Server) route(w *record, r *http.Request) {
	if !s.checkListener(w, r) {
		return
	}
	if r.Method == http.MethodHead {
		w.WriteHeader(http.StatusOK)
		return
	}
	if p := r.URL.Path; !cleanPath(p) {
		// The mux would redirect to the clean path; no client of this
		// API sends one, and a redirect is not an Anthropic answer.
		writeError(w, http.StatusNotFound, "not_found_error", fmt.Sprintf("Unknown endpoint: %s %s", r.Method, p))
		return
	}
	s.mux.ServeHTTP(w, r)
}

// cleanPath reports whether p is a rooted path without empty, "." or ".."
// elements (a trailing slash allowed): what the mux routes as it is.
func cleanPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

// routed adapts a handler of the request record to http.Handler: the mux
// passes on the *record route gave it.
func routed(h func(w *record, r *http.Request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h(w.(*record), r) })
}

// authed is routed behind the key check (member.go): a member key with
// Config.Members, else the API key of a non-loopback listener.
func (s *Server) authed(h func(w *record, r *http.Request)) http.Handler {
	return routed(func(w *record, r *http.Request) {
		switch {
		case s.cfg.Members != nil:
			if r, ok := s.checkMember(w, r); ok {
				h(w, r)
			}
		case s.loopback || s.checkKey(w, r):
			h(w, r)
		}
	})
}

// checkListener applies the listener's rules: on a loopback listener the
// Host header must name a loopback host (localhost, 127.0.0.1, [::1]; any
// port), so a web page cannot reach it by DNS rebinding; on any listener
// an Origin header is refused unless allow-listed, so a web page cannot
// spend the user's quota with a cross-site request.
func (s *Server) checkListener(w *record, r *http.Request) bool {
	if s.loopback && !loopbackHost(r.Host) {
		w.err = fmt.Errorf("refused Host %q", r.Host)
		writeError(w, http.StatusForbidden, "permission_error",
			fmt.Sprintf("Host %q is not a loopback host; this listener only answers requests for localhost, 127.0.0.1 or [::1]", r.Host))
		return false
	}
	if origin, ok := r.Header["Origin"]; ok {
		o := ""
		if len(origin) > 0 {
			o = origin[0]
		}
		if n, err := hostcheck.NormalizeOrigin(o); err != nil || !s.origins[n] {
			w.err = fmt.Errorf("refused Origin %q", o)
			writeError(w, http.StatusForbidden, "permission_error",
				fmt.Sprintf("Origin %q is not allowed; browsers may not call this API unless the origin is listed with --allowed-origins", o))
			return false
		}
	}
	return true
}

// loopbackHost reports whether a Host header ("host[:port]") names
// localhost or a loopback address (the check hostcheck.LoopbackHost makes,
// done here because it runs on every request).
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// httpError is a local failure answered with an Anthropic error body.
type httpError struct {
	status  int
	typ     string
	message string
}

func (e *httpError) Error() string { return e.message }

// readBody checks the content type, size and encoding of a POST body and
// returns it decoded. The body must arrive at the configured minimum rate
// (see Config.BodyMinRate); a slower one is cut and answered 408.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *httpError) {
	ct := r.Header.Get("Content-Type")
	if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
		return nil, &httpError{http.StatusUnsupportedMediaType, "invalid_request_error",
			fmt.Sprintf("Content-Type %q is not supported; send Content-Type: application/json", ct)}
	}
	limit := s.cfg.MaxBodyBytes
	tooLarge := &httpError{http.StatusRequestEntityTooLarge, "request_too_large",
		fmt.Sprintf("Request body exceeds the %d byte limit", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	sb := &slowBody{r: r.Body, rc: http.NewResponseController(w), start: time.Now(),
		grace: s.cfg.BodyGrace, rate: s.cfg.BodyMinRate, idle: s.cfg.BodyIdle}
	body, err := readBodyLimited(sb, r.ContentLength, limit)
	sb.done()
	if err != nil {
		if errors.Is(err, errTooLarge) {
			return nil, tooLarge
		}
		if sb.cut {
			// The connection cannot carry another request: the rest of
			// the body is still on its way.
			w.Header().Set("Connection", "close")
			return nil, &httpError{http.StatusRequestTimeout, "invalid_request_error",
				fmt.Sprintf("Request body arrived too slowly (%d bytes in %s); send it at %d bytes/s or more after the first %s, with no pause over %s",
					sb.n, time.Since(sb.start).Round(time.Millisecond), s.cfg.BodyMinRate, s.cfg.BodyGrace, s.cfg.BodyIdle)}
		}
		return nil, &httpError{http.StatusBadRequest, "invalid_request_error", "Could not read the request body"}
	}
	encodings := r.Header.Values("Content-Encoding")
	var codings []string
	for _, v := range encodings {
		for _, c := range strings.Split(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	for i := len(codings) - 1; i >= 0; i-- {
		body, err = decode(codings[i], body, limit)
		switch {
		case errors.Is(err, errTooLarge):
			return nil, tooLarge
		case errors.Is(err, errUnknownEncoding):
			return nil, &httpError{http.StatusUnsupportedMediaType, "invalid_request_error",
				fmt.Sprintf("Content-Encoding %q is not supported; send gzip, deflate or identity", codings[i])}
		case err != nil:
			return nil, &httpError{http.StatusBadRequest, "invalid_request_error",
				fmt.Sprintf("Request body is not valid %s data", codings[i])}
		}
	}
	return body, nil
}

// slowBody reads a request body under a read deadline that it moves
// before each read: at most idle from now, and no later than the time by
// which the body must have averaged rate bytes per second after grace.
// A trickled body (one byte every 2 s) is cut once grace has passed.
type slowBody struct {
	r     io.Reader
	rc    *http.ResponseController
	start time.Time
	grace time.Duration
	rate  int64
	idle  time.Duration

	n        int64 // bytes read so far
	cut      bool  // a read failed at the deadline
	deadline bool  // a deadline was set (and must be cleared)
}

func (b *slowBody) Read(p []byte) (int, error) {
	now := time.Now()
	dl := now.Add(b.idle)
	if byRate := b.start.Add(b.grace + time.Duration(float64(b.n)/float64(b.rate)*float64(time.Second))); byRate.Before(dl) {
		dl = byRate
	}
	if b.rc.SetReadDeadline(dl) == nil {
		b.deadline = true
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	if err != nil && b.deadline && (errors.Is(err, os.ErrDeadlineExceeded) || !time.Now().Before(dl)) {
		b.cut = true
	}
	return n, err
}

// done clears the deadline, so that it does not end the connection's
// later reads (net/http's watch for a client that goes away, the next
// request). After a cut it leaves the deadline passed: net/http would
// otherwise wait for the rest of the trickle before closing.
func (b *slowBody) done() {
	switch {
	case b.cut:
		_ = b.rc.SetReadDeadline(time.Unix(1, 0)) // fails only on a connection that is gone
	case b.deadline:
		_ = b.rc.SetReadDeadline(time.Time{}) // as above
	}
}

var (
	errTooLarge        = errors.New("body too large")
	errUnknownEncoding = errors.New("unknown content encoding")
)

// readBodyLimited reads a request body of the announced length (-1 when
// unknown) into one buffer. net/http ends a body at its Content-Length.
func readBodyLimited(r io.Reader, length, limit int64) ([]byte, error) {
	if length <= 0 || length > limit {
		return readLimited(r, limit)
	}
	buf := make([]byte, length)
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

func readLimited(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, errTooLarge
	}
	return b, nil
}

func decode(coding string, body []byte, limit int64) ([]byte, error) {
	var rd io.ReadCloser
	var err error
	switch coding {
	case "gzip", "x-gzip":
		rd, err = gzip.NewReader(bytes.NewReader(body))
	case "deflate":
		// RFC 9110 deflate is zlib-wrapped; some clients send raw deflate.
		rd, err = zlib.NewReader(bytes.NewReader(body))
		if err != nil {
			rd, err = flate.NewReader(bytes.NewReader(body)), nil
		}
	default:
		return nil, errUnknownEncoding
	}
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return readLimited(rd, limit)
}

func requestErrorMessage(err error) string {
	var re *translate.RequestError
	if errors.As(err, &re) {
		return re.Error()
	}
	return "Invalid request body"
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body) // fails only when the client has gone: nobody is left to tell
}

// writeError answers with Anthropic's error body.
func writeError(w http.ResponseWriter, status int, typ, message string) {
	var body bytes.Buffer
	writeErrorBody(&body, typ, message)
	writeJSON(w, status, body.Bytes())
}

// writeErrorBody writes Anthropic's error body to buf.
func writeErrorBody(buf *bytes.Buffer, typ, message string) {
	b, _ := json.Marshal(struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}{Type: "error", Error: struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	}{typ, message}})
	buf.Write(b)
}

// newID returns prefix + 24 hex digits. The ids only need to be unique
// (request and message ids), so the fast, randomly seeded math/rand/v2
// generator is enough; it costs no system call.
func newID(prefix string) string {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64()) //nolint:gosec // G404: ids need to be unique, not secret (see above)
	binary.LittleEndian.PutUint32(b[8:], rand.Uint32()) //nolint:gosec // G404: as above
	return prefix + hex.EncodeToString(b[:])
}

// goHeaderTooLarge is what net/http writes, straight to the connection
// and before any handler runs, when a request's header block exceeds
// http.Server.MaxHeaderBytes (net/http's server.go, errTooLarge). The
// listener's connections replace it with an Anthropic error body;
// TestHeaderTooLarge fails if a Go release changes these bytes.
var goHeaderTooLarge = []byte("HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large")

// Listener wraps the API listener (served with http.Server.MaxHeaderBytes
// set to MaxHeaderBytes): a request whose headers are too large is
// answered 431 with an Anthropic error body instead of net/http's plain
// text, counted in the request metric and logged.
func (s *Server) Listener(ln net.Listener) net.Listener { return &listener{Listener: ln, s: s} }

type listener struct {
	net.Listener
	s *Server
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &conn{Conn: c, s: l.s}, nil
}

type conn struct {
	net.Conn
	s *Server
}

func (c *conn) Write(b []byte) (int, error) {
	if !bytes.Equal(b, goHeaderTooLarge) {
		return c.Conn.Write(b)
	}
	msg := "Request headers exceed the " + strconv.Itoa(MaxHeaderBytes) + " byte limit; send smaller headers"
	var body bytes.Buffer
	writeErrorBody(&body, "request_too_large", msg)
	resp := "HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(body.Len()) + "\r\nConnection: close\r\n\r\n" + body.String()
	c.s.metrics.requests.WithLabelValues("431").Inc()
	c.s.cfg.Logger.Info("request", slog.Int(keyStatus, 431), slog.String("remote", c.RemoteAddr().String()),
		slog.String(keyErr, "request headers too large"))
	if _, err := c.Conn.Write([]byte(resp)); err != nil {
		return 0, err
	}
	return len(b), nil
}

// CloseWrite lets net/http half-close the connection after the 431, as it
// does on a bare TCP connection, so the client reads the answer.
func (c *conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
