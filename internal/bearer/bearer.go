// Package bearer holds the control plane's bearer tokens: reading them from
// files, keeping them out of logs and sending them on gRPC calls.
//
//	tok, warning, err := bearer.ReadFile(path) // trimmed; warning: a mode readable by others
//	creds := bearer.Credentials(tok)           // grpc.WithPerRPCCredentials(creds)
//	secret := tok.Reveal()                     // the one way to the secret
//
// A Token formats as "[redacted]" under every fmt verb, in slog and as
// text, so it can be passed around and logged by accident without
// leaking. Credentials sends "authorization: Bearer <token>" over TLS and
// over plaintext alike. The package has no server dependencies: clients
// (clodexctl, data planes, the benchmark) and the server share it.
package bearer

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"

	"google.golang.org/grpc/credentials"
)

// ErrEmpty reports a token that is empty after trimming whitespace.
var ErrEmpty = errors.New("token is empty")

// redacted is what a Token shows instead of its value.
const redacted = "[redacted]"

// Token is a bearer token. The zero Token is empty.
type Token struct {
	secret string
}

// Parse trims surrounding whitespace from s and returns it as a Token;
// an empty result is ErrEmpty.
func Parse(s string) (Token, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Token{}, ErrEmpty
	}
	return Token{secret: s}, nil
}

// ReadFile reads a token from path. The token is the file's content trimmed
// of surrounding whitespace; an empty file is an error. When the file is
// readable by its group or by others, warning describes the problem (it
// never contains the token) and the token is still returned.
func ReadFile(path string) (tok Token, warning string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		// The *PathError names the operation and the path, never content.
		return Token{}, "", fmt.Errorf("read token file: %w", err)
	}
	tok, err = Parse(string(b))
	if err != nil {
		return Token{}, "", fmt.Errorf("read token file %s: %w", path, err)
	}
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		warning = fmt.Sprintf("token file %s has mode %s: it is readable by group or others; chmod 600 it", path, fi.Mode().Perm())
	}
	return tok, warning, nil
}

// IsZero reports whether t is the zero (empty) Token.
func (t Token) IsZero() bool { return t.secret == "" }

// Reveal returns the secret. Call it only where the secret is sent or
// compared.
func (t Token) Reveal() string { return t.secret }

// Equal reports whether t and u hold the same secret. It is not constant
// time; servers compare presented tokens with a constant-time check.
func (t Token) Equal(u Token) bool { return t.secret == u.secret }

// String returns "[redacted]".
func (t Token) String() string { return redacted }

// GoString returns "[redacted]", so %#v does not leak either.
func (t Token) GoString() string { return redacted }

// Format prints "[redacted]" for every verb.
func (t Token) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// LogValue implements slog.LogValuer.
func (t Token) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText returns "[redacted]", so encoders do not leak the token.
func (t Token) MarshalText() ([]byte, error) { return []byte(redacted), nil }

var _ slog.LogValuer = Token{}

// Credentials returns per-RPC credentials that send t as
// "authorization: Bearer <token>". They do not require transport security:
// the control plane may be reached over loopback plaintext; the server
// warns when it listens beyond loopback without TLS.
func Credentials(t Token) credentials.PerRPCCredentials {
	return perRPC{md: map[string]string{"authorization": "Bearer " + t.secret}}
}

type perRPC struct {
	md map[string]string // immutable after construction
}

func (p perRPC) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return p.md, nil
}

func (perRPC) RequireTransportSecurity() bool { return false }

// FileMode is the mode token files should have.
const FileMode fs.FileMode = 0o600
