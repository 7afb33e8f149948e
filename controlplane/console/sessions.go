package console

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Session limits: a session ends after SessionIdle without a request, or
// SessionMax after sign-in, whichever comes first. At most maxSessions
// are kept; a new sign-in past it ends the oldest.
const (
	SessionIdle = time.Hour
	SessionMax  = 12 * time.Hour
	maxSessions = 64
)

// cookieName is the session cookie, sent only to /console/.
const cookieName = "clodex_console"

// session is one signed-in browser.
type session struct {
	operator string // who signed in, from the link
	csrf     string // the token state-changing requests must carry
	created  time.Time
	lastSeen time.Time
	flash    string // a confirmation shown once by the next page
}

// sessions keeps the signed-in browsers, keyed by the SHA-256 of the
// cookie's value.
type sessions struct {
	now func() time.Time // immutable

	mu   sync.Mutex // guards byID
	byID map[[sha256.Size]byte]*session
}

func newSessions(now func() time.Time) *sessions {
	return &sessions{now: now, byID: map[[sha256.Size]byte]*session{}}
}

// start makes a session for operator and returns the cookie's value.
func (s *sessions) start(operator string) string {
	now := s.now()
	id := randomToken()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	if len(s.byID) >= maxSessions {
		oldest := slices.MinFunc(keys(s.byID), func(a, b [sha256.Size]byte) int {
			return s.byID[a].created.Compare(s.byID[b].created)
		})
		delete(s.byID, oldest)
	}
	s.byID[sha256.Sum256([]byte(id))] = &session{operator: operator, csrf: randomToken(), created: now, lastSeen: now}
	return id
}

// get returns a copy of the request's session and takes its flash, or
// false when it has none that is live.
func (s *sessions) get(r *http.Request) (session, bool) {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" || len(c.Value) > 128 {
		return session{}, false
	}
	now := s.now()
	sum := sha256.Sum256([]byte(c.Value))
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.byID[sum]
	if !ok || expired(ss, now) {
		delete(s.byID, sum)
		return session{}, false
	}
	ss.lastSeen = now
	out := *ss
	ss.flash = ""
	return out, true
}

// setFlash leaves a confirmation for the session's next page.
func (s *sessions) setFlash(r *http.Request, msg string) {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return
	}
	sum := sha256.Sum256([]byte(c.Value))
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss, ok := s.byID[sum]; ok {
		ss.flash = msg
	}
}

// end forgets the request's session.
func (s *sessions) end(r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		s.mu.Lock()
		delete(s.byID, sha256.Sum256([]byte(c.Value)))
		s.mu.Unlock()
	}
}

func (s *sessions) expireLocked(now time.Time) {
	for k, ss := range s.byID {
		if expired(ss, now) {
			delete(s.byID, k)
		}
	}
}

func expired(ss *session, now time.Time) bool {
	return now.Sub(ss.lastSeen) >= SessionIdle || now.Sub(ss.created) >= SessionMax
}

// validCSRF reports whether got is the session's CSRF token.
func (ss session) validCSRF(got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(ss.csrf)) == 1
}

func keys[K comparable, V any](m map[K]V) []K {
	out := make([]K, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
