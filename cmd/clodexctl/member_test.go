package main

import (
	"crypto/sha256"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// member create draws a key, writes it to --out (mode 0600, never over an
// existing file) and sends only its SHA-256: the control plane's list
// shows the member with its accounts (ids hashed to keys), pin and cap,
// and the data planes are pushed the key's digest. list and remove manage
// them; bad input exits 2 naming what is wrong.
func TestMemberCommands(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	dir := t.TempDir()
	out := filepath.Join(dir, "alice.key")
	keyB := account.Key("acct-b")
	o, _, err := ctl(t, srv, "member", "create", "alice", "--accounts", "acct-a,"+keyB, "--pin", "acct-a", "--rate", "3", "--out", out)
	if err != nil {
		t.Fatalf("member create: %v", err)
	}
	keyA := account.Key("acct-a")
	if !strings.Contains(o, "member alice created (accounts "+min(keyA, keyB)+","+max(keyA, keyB)+", pinned to "+keyA+", a cap of 3 new connections a minute); their key is in "+out) {
		t.Errorf("member create printed %q", o)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	key := strings.TrimSpace(string(b))
	if !regexp.MustCompile(`^clx_[A-Za-z0-9_-]{43}$`).MatchString(key) {
		t.Errorf("the key file holds %q; want clx_ and 43 base64url characters", key)
	}
	if fi, err := os.Stat(out); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode = %v, %v; want 0600", fi.Mode().Perm(), err)
	}
	if strings.Contains(o, key) {
		t.Error("member create printed the key")
	}
	// The control plane pushes the key's digest, never the key.
	st, err := controlplanev1.NewAgentServiceClient(srv.Dial(srv.AgentToken, nil)).Connect(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: &controlplanev1.AgentHello{
		AgentId: "dp-1", CapabilityVersion: 6}}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	sum := sha256.Sum256([]byte(key))
	if err != nil || len(m.GetMembers().GetMembers()) != 1 || string(m.GetMembers().GetMembers()[0].GetKeySha256()) != string(sum[:]) {
		t.Errorf("the member push = %v, %v; want alice with the digest of the key in %s", m, err, out)
	}

	if _, _, err := ctl(t, srv, "member", "create", "bob", "--out", filepath.Join(dir, "bob.key")); err != nil {
		t.Fatal(err)
	}
	o, _, err = ctl(t, srv, "member", "list")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(o), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") || !strings.Contains(lines[1], "alice") || !strings.Contains(lines[1], "3/min") ||
		!strings.Contains(lines[1], keyA) || !strings.Contains(lines[2], "bob") || !strings.HasSuffix(lines[2], "all") {
		t.Errorf("member list =\n%s", o)
	}
	o, _, err = ctl(t, srv, "member", "list", "-o", "json")
	var views []map[string]any
	if err != nil || json.Unmarshal([]byte(o), &views) != nil || len(views) != 2 || views[0]["name"] != "alice" || views[0]["rate_per_minute"] != 3.0 || views[0]["pin"] != keyA {
		t.Errorf("member list -o json = %s, %v", o, err)
	}

	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no out", []string{"member", "create", "carol"}, "member create needs --out FILE"},
		{"existing out", []string{"member", "create", "carol", "--out", out}, "exists"},
		{"bad rate", []string{"member", "create", "carol", "--rate", "fast", "--out", filepath.Join(dir, "c1")}, `--rate "fast" is invalid; want a whole number of new connections a minute, 0..600`},
		{"rate too high", []string{"member", "create", "carol", "--rate", "601", "--out", filepath.Join(dir, "c2")}, `--rate "601" is invalid`},
		{"pin outside", []string{"member", "create", "carol", "--accounts", "acct-a", "--pin", "acct-b", "--out", filepath.Join(dir, "c3")}, "is not one of the member's accounts"},
		{"bad name", []string{"member", "create", "car ol", "--out", filepath.Join(dir, "c4")}, `member name "car ol" is invalid`},
		{"unknown subcommand", []string{"member", "rename", "alice"}, `unknown member subcommand "rename"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := ctl(t, srv, tt.args...)
			if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%v = %v (exit %d); want exit 2 saying %q", tt.args, err, exitCode(err), tt.want)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(dir, "c3")); err == nil {
		t.Error("a refused member create left its key file behind")
	}

	if o, _, err := ctl(t, srv, "member", "remove", "alice"); err != nil || !strings.Contains(o, "member alice removed") {
		t.Errorf("member remove = %q, %v", o, err)
	}
	if _, _, err := ctl(t, srv, "member", "remove", "alice"); err == nil || exitCode(err) != 1 || !strings.Contains(err.Error(), "no member named alice") {
		t.Errorf("member remove of a removed member = %v; want exit 1 saying there is none", err)
	}
}
