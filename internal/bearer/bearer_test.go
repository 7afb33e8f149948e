package bearer

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const secret = "s3cret-token-value"

func TestParse(t *testing.T) {
	tests := []struct {
		in      string
		want    string
		wantErr error
	}{
		{"abc", "abc", nil},
		{"  abc\n", "abc", nil},
		{"\tabc def \r\n", "abc def", nil},
		{"", "", ErrEmpty},
		{" \n\t ", "", ErrEmpty},
	}
	for _, tt := range tests {
		tok, err := Parse(tt.in)
		if !errors.Is(err, tt.wantErr) {
			t.Errorf("Parse(%q) error = %v, want %v", tt.in, err, tt.wantErr)
			continue
		}
		if got := tok.Reveal(); got != tt.want {
			t.Errorf("Parse(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestReadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string, mode os.FileMode) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // umask-proof
			t.Fatal(err)
		}
		return p
	}

	t.Run("private", func(t *testing.T) {
		p := write("private", secret+"\n", 0o600)
		tok, warn, err := ReadFile(p)
		if err != nil || warn != "" || tok.Reveal() != secret {
			t.Fatalf("ReadFile = %q, %q, %v; want the secret, no warning", tok.Reveal(), warn, err)
		}
	})
	t.Run("group readable warns", func(t *testing.T) {
		p := write("shared", secret, 0o640)
		tok, warn, err := ReadFile(p)
		if err != nil || tok.Reveal() != secret {
			t.Fatalf("ReadFile = %q, %v", tok.Reveal(), err)
		}
		if !strings.Contains(warn, "readable by group or others") || !strings.Contains(warn, p) {
			t.Errorf("warning = %q, want it to name the file and the problem", warn)
		}
		if strings.Contains(warn, secret) {
			t.Errorf("warning leaks the token: %q", warn)
		}
	})
	t.Run("empty", func(t *testing.T) {
		p := write("empty", "  \n", 0o600)
		_, _, err := ReadFile(p)
		if !errors.Is(err, ErrEmpty) || !strings.Contains(err.Error(), p) {
			t.Errorf("ReadFile(empty) error = %v, want ErrEmpty naming the file", err)
		}
	})
	t.Run("missing", func(t *testing.T) {
		_, _, err := ReadFile(filepath.Join(dir, "nope"))
		if !errors.Is(err, os.ErrNotExist) {
			t.Errorf("ReadFile(missing) error = %v, want ErrNotExist", err)
		}
	})
}

func TestTokenRedacts(t *testing.T) {
	tok, err := Parse(secret)
	if err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x"} {
		if got := fmt.Sprintf(verb, tok); strings.Contains(got, secret) || strings.Contains(got, fmt.Sprintf("%x", secret)) {
			t.Errorf("Sprintf(%s) = %q leaks the token", verb, got)
		}
	}
	if got := fmt.Sprintf("%v", struct{ T Token }{tok}); strings.Contains(got, secret) {
		t.Errorf("struct formatting leaks the token: %q", got)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("x", "token", tok, "nested", struct{ T Token }{tok})
	if strings.Contains(buf.String(), secret) {
		t.Errorf("slog output leaks the token: %s", buf.String())
	}
}

func TestCredentials(t *testing.T) {
	tok, _ := Parse(secret)
	c := Credentials(tok)
	if c.RequireTransportSecurity() {
		t.Error("RequireTransportSecurity() = true, want false")
	}
	md, err := c.GetRequestMetadata(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := md["authorization"], "Bearer "+secret; got != want {
		t.Errorf("authorization = %q, want %q", got, want)
	}
}
