package console

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"time"
)

// LinkTTL is how long a sign-in link works if it is not used.
const LinkTTL = 60 * time.Second

// maxPendingLinks bounds the links issued and not yet used or expired: an
// admin asking in a loop costs at most this many entries.
const maxPendingLinks = 32

// ErrTooManyLinks refuses a link while maxPendingLinks wait to be used.
var ErrTooManyLinks = errors.New("too many console sign-in links are waiting to be used; wait a minute (a link expires 60 s after it was issued)")

// ErrNoConsole refuses a link on a replica that serves no console.
var ErrNoConsole = errors.New("this control plane serves no web console: start it with --admin-listen (the console is at /console/ on the admin listener)")

// Links issues and redeems one-time sign-in links. The control plane's
// CreateConsoleLink RPC (admin token) issues them; the console's
// /console/signin redeems each once. Only a token's SHA-256 is kept.
type Links struct {
	base string           // the console's base URL, "http://127.0.0.1:9090" (immutable)
	now  func() time.Time // immutable

	mu      sync.Mutex // guards pending
	pending map[[sha256.Size]byte]link
}

type link struct {
	operator string
	expires  time.Time
}

// NewLinks returns the link issuer of a console reached at base (scheme
// and host, e.g. "http://127.0.0.1:9090"); now is the clock (nil:
// time.Now). An empty base makes a Links that refuses every link with
// ErrNoConsole.
func NewLinks(base string, now func() time.Time) (*Links, error) {
	if now == nil {
		now = time.Now
	}
	if base != "" {
		u, err := url.Parse(base)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("console URL %q is invalid; want http:// or https:// with a host and no path, e.g. https://clodex.example.com", base)
		}
		base = u.Scheme + "://" + u.Host
	}
	return &Links{base: base, now: now, pending: map[[sha256.Size]byte]link{}}, nil
}

// Base is the console's base URL ("" when it serves none).
func (l *Links) Base() string { return l.base }

// Issue returns a new one-time link for operator and when it expires.
func (l *Links) Issue(operator string) (string, time.Time, error) {
	if l == nil || l.base == "" {
		return "", time.Time{}, ErrNoConsole
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expireLocked(now)
	if len(l.pending) >= maxPendingLinks {
		return "", time.Time{}, ErrTooManyLinks
	}
	tok := randomToken()
	exp := now.Add(LinkTTL)
	l.pending[sha256.Sum256([]byte(tok))] = link{operator: operator, expires: exp}
	return l.base + "/console/signin?link=" + tok, exp, nil
}

// redeem uses a link's token: the operator it was issued for, or false
// when it is unknown, used or expired.
func (l *Links) redeem(tok string) (string, bool) {
	if tok == "" || len(tok) > 128 {
		return "", false
	}
	now := l.now()
	sum := sha256.Sum256([]byte(tok))
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expireLocked(now)
	k, ok := l.pending[sum]
	if !ok {
		return "", false
	}
	delete(l.pending, sum) // one use
	return k.operator, true
}

func (l *Links) expireLocked(now time.Time) {
	for sum, k := range l.pending {
		if !now.Before(k.expires) {
			delete(l.pending, sum)
		}
	}
}

// randomToken returns 32 random bytes, base64url without padding.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return base64.RawURLEncoding.EncodeToString(b[:])
}
