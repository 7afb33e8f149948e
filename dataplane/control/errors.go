package control

import (
	"errors"
	"fmt"
	"time"
)

// ErrInvalidKey reports an account argument that is not an account key. The
// error never repeats the argument, which may be a raw account id.
var ErrInvalidKey = errors.New(`account key is invalid; want "acct_" followed by 16 lowercase hex digits (account.Key of the ChatGPT account id)`)

// ErrClosed reports an Admit on a closed Client.
var ErrClosed = errors.New("control-plane client is closed")

// errNoBroker reports a token asked of a Client that does not take its
// tokens from the broker.
var errNoBroker = errors.New("this data plane reads its tokens from auth.json files, not from the control plane's credential broker (Config.Broker is off)")

// RefusedError is a refusal: no token was spent and no socket may be opened.
// It is retryable; the caller's next attempt waits exactly RetryAfter instead
// of its backoff rung (the wait bound is derived assuming that substitution).
type RefusedError struct {
	// RetryAfter is the hint to wait before the next attempt: whole
	// seconds, at least 1 s.
	RetryAfter time.Duration
	// RequiredWait is the wait a slot would really need (diagnostics); it
	// may exceed RetryAfter.
	RequiredWait time.Duration
	// Local reports a refusal by the local fallback bucket.
	Local bool
	// Paused reports a granted slot given back because the control plane
	// paused the account after an upstream 403 (pushed on the agent
	// stream) while the request waited; RetryAfter is the pause's end.
	Paused bool
	// Member names the member whose own cap refused (its bucket, before
	// the account's), at MemberRate new sockets a minute; "" when the
	// account's bucket refused.
	Member     string
	MemberRate int
}

// Error returns "admission refused: retry after 4s" (or "admission refused
// locally: ..."); it names no account.
func (e *RefusedError) Error() string {
	where := ""
	switch {
	case e.Member != "" && e.Local:
		where = " locally by the member's cap"
	case e.Member != "":
		where = " by the member's cap"
	case e.Local:
		where = " locally"
	case e.Paused:
		where = " (account paused after an upstream 403)"
	}
	return fmt.Sprintf("admission refused%s: retry after %v", where, e.RetryAfter)
}

// Retryable reports true: a refusal is always worth retrying after
// RetryAfter.
func (e *RefusedError) Retryable() bool { return true }

// PacerRefusal returns the wait the refusal asks for, RetryAfter.
func (e *RefusedError) PacerRefusal() time.Duration { return e.RetryAfter }

// MemberCap returns the member whose cap refused and its rate ("" and 0
// when the account's bucket refused).
func (e *RefusedError) MemberCap() (member string, rate int) { return e.Member, e.MemberRate }
