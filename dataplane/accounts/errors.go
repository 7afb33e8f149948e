package accounts

import (
	"errors"
	"time"
)

var (
	// ErrLoginRequired reports a refresh token the identity provider refused
	// for good (refresh_token_reused, refresh_token_expired,
	// refresh_token_invalidated, or any 401): it is never presented again
	// and the user has to sign in again.
	ErrLoginRequired error = &LoginRequiredError{}
	// ErrRefreshDisabled reports that a new token is needed but the source
	// is in RefreshNever mode and the file holds none.
	ErrRefreshDisabled = errors.New("token refresh is disabled (--refresh=never)")
	// ErrTokenUnchanged reports that a token rejected upstream could not be
	// replaced by a different one.
	ErrTokenUnchanged = errors.New("the rejected access token is still the current one")
)

// LoginRequiredError is [ErrLoginRequired] with the words the client is
// told: in a fleet the data plane cannot sign in itself, an operator
// must (clodexctl account login). errors.Is(err, ErrLoginRequired) holds.
type LoginRequiredError struct {
	// Message is the client's message; it never contains a token.
	Message string
}

func (e *LoginRequiredError) Error() string {
	if e.Message == "" {
		return "the ChatGPT sign-in can no longer be refreshed; run `codex login` to sign in again"
	}
	return e.Message
}

// Is makes the error match ErrLoginRequired.
func (e *LoginRequiredError) Is(target error) bool { return target == ErrLoginRequired }

// LoginRequired returns the client's words; "" for ErrLoginRequired itself
// (a standalone sign-in: run codex login).
func (e *LoginRequiredError) LoginRequired() string { return e.Message }

// UnavailableError reports a credential that cannot be had now but may
// be soon (the control plane's credential broker is unreachable, or could
// not refresh yet): the turn is answered 503 with retry-after.
type UnavailableError struct {
	// Message is the client's message; it never contains a token.
	Message string
	// RetryAfter is when to try again.
	RetryAfter time.Duration
}

func (e *UnavailableError) Error() string { return e.Message }

// Unavailable returns the client's words and when to try again.
func (e *UnavailableError) Unavailable() (message string, retryAfter time.Duration) {
	return e.Message, e.RetryAfter
}
