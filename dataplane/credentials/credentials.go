package credentials

import (
	"context"
	"time"

	"github.com/clodex/clodex/internal/codexauth"
)

// Source hands out the current credential. Implementations are safe for
// concurrent use. A refreshing source ([RefreshingFile]) may block while
// it refreshes; it honours ctx.
type Source interface {
	Credential(ctx context.Context) (codexauth.Credential, error)
}

// Static is a Source that always returns the same credential (tests, and
// tokens given directly on the command line).
type Static codexauth.Credential

// Credential implements Source.
func (s Static) Credential(ctx context.Context) (codexauth.Credential, error) {
	if err := ctx.Err(); err != nil {
		return codexauth.Credential{}, err
	}
	return codexauth.Credential(s), nil
}

// LoginRequiredError is [ErrLoginRequired] with the words the client is
// told: in a fleet the data plane cannot sign in itself, an operator
// must (clodexctl account login). errors.Is(err, ErrLoginRequired) holds.
type LoginRequiredError struct {
	// Message is the client's message; it never contains a token.
	Message string
}

func (e *LoginRequiredError) Error() string { return e.Message }

// Is makes the error match ErrLoginRequired.
func (e *LoginRequiredError) Is(target error) bool { return target == ErrLoginRequired }

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
