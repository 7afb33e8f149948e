package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// A data plane whose agent token the control plane refuses at start
// exits 1 with a message naming the cause and what to check, before it
// says it is ready; it never prints the token.
func TestWrongAgentTokenAtStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	s := startSim(t)
	cp := controlplanetest.Start(t, nil)
	tok := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(tok, []byte("not-the-agent-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), bin, append(s.args(), "--listen", "127.0.0.1:0", "--control-plane", cp.Addr, "--agent-token-file", tok)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("clodex-dataplane with a wrong agent token = %v, want exit status 1\nstderr:\n%s", err, stderr.String())
	}
	want := "clodex-dataplane: the control plane at " + cp.Addr + " refused this data plane's agent token (Unauthenticated: missing or invalid bearer token"
	if !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), "check --agent-token-file (or CLODEX_AGENT_TOKEN) and --control-plane") {
		t.Errorf("stderr:\n%s\nwant %q and what to check", stderr.String(), want)
	}
	if stdout.Len() != 0 {
		t.Errorf("stdout = %q, want nothing: the data plane never became ready", stdout.String())
	}
	if strings.Contains(stderr.String(), "not-the-agent-token") {
		t.Errorf("the token reached the output:\n%s", stderr.String())
	}
}

// A control plane that cannot be reached is not a refusal: the data
// plane says so and starts (admitting locally), waiting for it.
func TestUnreachableControlPlaneAtStart(t *testing.T) {
	s := startSim(t)
	tok := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(tok, []byte("secret-agent-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	r := startRun(t, nil, append(s.args(), "--control-plane", addr, "--agent-token-file", tok)...)
	if got := turn(t, r.base, "#sim reply local"); got != "local" {
		t.Errorf("reply = %q, want \"local\"", got)
	}
	out := r.stderr.String()
	for _, want := range []string{
		`msg="control plane not reachable yet; serving with local admission and waiting for it" addr=` + addr,
		"the control plane at " + addr + " cannot be reached: Unavailable",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log has no %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "refused this data plane's agent token") {
		t.Errorf("an unreachable control plane is reported as a refusal:\n%s", out)
	}
}

// An agent credential revoked while the data plane runs stops it: every
// turn is then answered 403 permission_error, x-should-retry: false, no
// retry-after, saying it was revoked and what the operator must do. The
// delay from the removal to the first such answer is printed.
func TestRevokedAgentCredential(t *testing.T) {
	s := startSim(t)
	cp := controlplanetest.Start(t, nil)
	tok, err := bearer.Parse("scoped-token-of-dp-1")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(tok.Reveal()))
	admin := controlplanev1.NewAdminServiceClient(cp.Dial(cp.AdminToken, nil))
	if _, err := admin.CreateAgentCredential(t.Context(), &controlplanev1.CreateAgentCredentialRequest{
		Name: "dp-1", Accounts: []string{account.Key(simAccount)}, TokenSha256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	tokFile := filepath.Join(t.TempDir(), "agent.token")
	if err := os.WriteFile(tokFile, []byte(tok.Reveal()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startRun(t, map[string]string{"CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN": "600"},
		append(s.args(), "--control-plane", cp.Addr, "--agent-token-file", tokFile)...)
	if got := turn(t, r.base, "#sim reply before"); got != "before" {
		t.Fatalf("reply = %q, want \"before\"", got)
	}

	removed := time.Now()
	if _, err := admin.RemoveAgentCredential(t.Context(), &controlplanev1.RemoveAgentCredentialRequest{Name: "dp-1"}); err != nil {
		t.Fatal(err)
	}
	var resp *http.Response
	var body []byte
	served := 0
	for ; ; served++ {
		resp, body = postTurn(t, r.base, "#sim reply after")
		if resp.StatusCode != http.StatusOK || served == 3000 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("the first turn refused was answered %v after the credential's removal was sent (%d turns served in between)",
		time.Since(removed).Round(time.Millisecond), served)
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	wantMsg := `This data plane's agent credential "dp-1" was revoked on the control plane at ` + cp.Addr +
		" (clodexctl agent remove), so it serves no turns; an operator must create a new one (clodexctl agent create NAME --accounts ... --out FILE) and restart the data plane with --agent-token-file FILE"
	if resp.StatusCode != http.StatusForbidden || e.Type != "error" || e.Error.Type != "permission_error" || e.Error.Message != wantMsg {
		t.Errorf("after the revocation: %d %s\nwant 403 permission_error %q", resp.StatusCode, body, wantMsg)
	}
	if resp.Header.Get("X-Should-Retry") != "false" || resp.Header.Get("Retry-After") != "" {
		t.Errorf("headers x-should-retry %q, retry-after %q; want false and none", resp.Header.Get("X-Should-Retry"), resp.Header.Get("Retry-After"))
	}
	// And every turn after it, while the credential stays revoked.
	if resp, _ := postTurn(t, r.base, "#sim reply again"); resp.StatusCode != http.StatusForbidden {
		t.Errorf("the next turn = %d, want 403", resp.StatusCode)
	}
	if !strings.Contains(r.stderr.String(), "the control plane refuses this data plane's agent credential") {
		t.Errorf("the log does not say the credential is refused:\n%s", r.stderr.String())
	}
}

// postTurn sends one non-streaming turn and returns the response and its
// body.
func postTurn(t *testing.T, base, prompt string) (*http.Response, []byte) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	body := `{"model":"gpt-5.5","max_tokens":100,"messages":[{"role":"user","content":` + jsonString(prompt) + `}]}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/messages?beta=true", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Api-Key", "anything")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(bufio.NewReader(resp.Body))
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}
