package gateway

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/clodex/clodex/dataplane/accounts"
	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/internal/account"
)

// Who calls: a data plane serving member keys (Config.Members, the
// data plane's --member-keys) answers only a key of the member list the
// control plane pushed, sent as x-api-key or Authorization: Bearer, and
// puts the member in the request's context (memberOf); otherwise a
// non-loopback listener requires Config.APIKey, and a loopback one takes
// any key. Every refusal of a key is answered here, by refuseKey: 401
// authentication_error with x-should-retry: false. The check reads
// nothing but the headers and costs one SHA-256 and a map read: an
// unauthenticated caller costs no memory and no state.

// MemberKeys is the member list a data plane serving member keys checks
// every key against. *accounts.Members implements it.
type MemberKeys interface {
	// Lookup returns the member whose key is key: ready is false before
	// the control plane pushed a list, m is nil for a key no member holds.
	Lookup(key string) (m *accounts.Member, ready bool)
}

// memberOf returns the name of the member whose key authenticated the
// request, or "" (no member keys, or a turn of an unauthenticated
// loopback client). It is the one place the gateway reads it.
func memberOf(ctx context.Context) string {
	if m := accounts.MemberFrom(ctx); m != nil {
		return m.Name
	}
	return ""
}

// presentedKey is the key a request carries: x-api-key, else the bearer
// token of Authorization.
func presentedKey(r *http.Request) string {
	key := strings.TrimSpace(r.Header.Get("X-Api-Key"))
	if key == "" {
		if auth := r.Header.Get("Authorization"); len(auth) > 7 && strings.EqualFold(auth[:7], "bearer ") {
			key = strings.TrimSpace(auth[7:])
		}
	}
	return key
}

// errMembersNotYet answers a key before the control plane pushed the
// member list (a data plane starting, its control plane not answering).
var errMembersNotYet = errors.New("the member list has not arrived from the control plane yet")

// checkMember authenticates r by its member key and returns it with the
// member in its context; false when it answered the request (401 for a
// key no member holds, 503 before the member list arrived).
func (s *Server) checkMember(w *record, r *http.Request) (*http.Request, bool) {
	key := presentedKey(r)
	m, ready := s.cfg.Members.Lookup(key)
	switch {
	case key == "":
		s.refuseKey(w, "missing member key", "this data plane serves member keys: send your member key (clodexctl member create) in x-api-key or Authorization: Bearer")
		return r, false
	case !ready:
		w.err = errMembersNotYet
		e := retry.Answer(w.Header(), &retry.UpstreamError{Status: http.StatusServiceUnavailable, Type: "api_error",
			Message: "This data plane serves member keys and has not received the member list from its control plane yet"}, retry.Facts{}, s.rand)
		writeJSON(w, e.Status, retry.ErrorBody(e))
		return r, false
	case m == nil:
		s.refuseKey(w, "unknown member key", "invalid member key: it is not the key of a member of this team (it may have been removed: clodexctl member list shows the members); ask an operator for a key (clodexctl member create NAME --out FILE)")
		return r, false
	}
	w.member = m.Name
	return r.WithContext(accounts.WithMember(r.Context(), m)), true
}

// checkKey requires the configured key on a non-loopback listener.
func (s *Server) checkKey(w *record, r *http.Request) bool {
	key := presentedKey(r)
	got := sha256.Sum256([]byte(key))
	if key == "" || subtle.ConstantTimeCompare(got[:], s.keyHash[:]) != 1 {
		s.refuseKey(w, "missing or wrong API key", "invalid x-api-key: this listener requires the configured API key in x-api-key or Authorization: Bearer")
		return false
	}
	return true
}

// refuseKey answers a request whose key is refused: 401
// authentication_error, x-should-retry: false (the same key fails again).
// why goes to the log line, message to the client; neither holds the key.
func (s *Server) refuseKey(w *record, why, message string) {
	w.err = errors.New(why)
	w.Header().Set("X-Should-Retry", "false")
	writeError(w, http.StatusUnauthorized, "authentication_error", message)
}

// withRequestedAccount returns ctx carrying the account r asks for with
// X-Clodex-Account (an account key, or a ChatGPT account id, which is
// hashed into its key), for the accounts router; ctx itself without one.
func withRequestedAccount(ctx context.Context, r *http.Request) context.Context {
	v := strings.TrimSpace(r.Header.Get(accounts.HeaderAccount))
	if v == "" {
		return ctx
	}
	if !account.IsKey(v) {
		v = account.Key(v)
	}
	return accounts.WithAccount(ctx, v)
}
