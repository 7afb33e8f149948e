package codexauth

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"time"
)

// Secret is a sensitive string, such as an OAuth access token. It redacts
// itself when printed with the fmt package or logged with slog; use
// [Secret.Reveal], or the conversion string(s) it is, where the real
// value must go on the wire.
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
func (s Secret) GoString() string { return fmt.Sprintf("codexauth.Secret(%q)", s.String()) }

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
