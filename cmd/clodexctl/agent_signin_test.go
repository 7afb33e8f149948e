package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
)

// agent create refuses an account the broker holds no sign-in for, naming
// it as typed and how to sign it in, and leaves no token file; without a
// broker it creates the credential and says what the token then needs.
func TestAgentCreateNeedsSignIn(t *testing.T) {
	srv := controlplanetest.Start(t, &controlplanetest.Options{Broker: true})
	out := filepath.Join(t.TempDir(), "team.token")
	_, _, err := ctl(t, srv, "agent", "create", "team", "--accounts", "nosuch", "--out", out)
	if err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "no sign-in for nosuch (key "+account.Key("nosuch")+")") ||
		!strings.Contains(err.Error(), "clodexctl account import --codex-auth FILE") {
		t.Errorf("agent create --accounts nosuch = %v; want exit 1 naming nosuch and how to import it", err)
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		t.Errorf("the refused credential's token file: %v; want none left", err)
	}

	plain := startServer(t)
	o, errOut, err := ctl(t, plain, "agent", "create", "team", "--accounts", "nosuch", "--out", out)
	if err != nil || !strings.Contains(o, "agent credential team created") || !strings.Contains(errOut, "runs no credential broker") ||
		!strings.Contains(errOut, "--codex-auth") {
		t.Errorf("agent create without a broker = %v\nstdout %s\nstderr %s\nwant it created, with a note that the data plane needs its own --codex-auth", err, o, errOut)
	}
}
