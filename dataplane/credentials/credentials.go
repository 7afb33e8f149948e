package credentials

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"
)

// Secret is a sensitive string, such as an OAuth access token. It redacts
// itself when printed with the fmt package or logged with slog; use
// [Secret.Reveal] where the real value must go on the wire.
type Secret string

const redacted = "[redacted]"

// Reveal returns the secret's value. Call it only to put the value on the
// wire (an Authorization header), never to log it.
func (s Secret) Reveal() string { return string(s) }

// String implements fmt.Stringer and always redacts.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return redacted
}

// GoString implements fmt.GoStringer and always redacts.
func (s Secret) GoString() string { return fmt.Sprintf("credentials.Secret(%q)", s.String()) }

// Format implements fmt.Formatter so that every verb, including %s, %v, %q
// and %x, prints the redacted form.
func (s Secret) Format(f fmt.State, verb rune) {
	switch verb {
	case 'q':
		fmt.Fprintf(f, "%q", s.String())
	case 'v':
		if f.Flag('#') {
			fmt.Fprint(f, s.GoString())
			return
		}
		fmt.Fprint(f, s.String())
	default:
		fmt.Fprint(f, s.String())
	}
}

// MarshalJSON always redacts, so a struct holding a Secret cannot leak it
// through a JSON log handler or an error body. Code that must persist the
// value (updateAuthJSON, writing back refreshed tokens) copies Reveal()
// into a plain string.
func (s Secret) MarshalJSON() ([]byte, error) { return json.Marshal(s.String()) }

// UnmarshalJSON reads a JSON string.
func (s *Secret) UnmarshalJSON(b []byte) error {
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*s = Secret(v)
	return nil
}

// LogValue implements slog.LogValuer and always redacts.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.String()) }

// Credential is what one upstream request needs to authenticate.
type Credential struct {
	// AccessToken is the ChatGPT OAuth access token, sent as
	// "Authorization: Bearer".
	AccessToken Secret
	// AccountID is the ChatGPT account id, sent as chatgpt-account-id; empty
	// when it cannot be determined (the header is then omitted).
	AccountID string
	// Expiry is the access token's exp claim; zero when unknown (an opaque
	// token).
	Expiry time.Time
}

// Source hands out the current credential. Implementations are safe for
// concurrent use. A refreshing source ([RefreshingFile]) may block while
// it refreshes; it honours ctx.
type Source interface {
	Credential(ctx context.Context) (Credential, error)
}

// Static is a Source that always returns the same credential (tests, and
// tokens given directly on the command line).
type Static Credential

// Credential implements Source.
func (s Static) Credential(ctx context.Context) (Credential, error) {
	if err := ctx.Err(); err != nil {
		return Credential{}, err
	}
	return Credential(s), nil
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
