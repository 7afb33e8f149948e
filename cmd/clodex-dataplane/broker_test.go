package main

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/codexauth"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/codexsim/simauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// answer posts one turn and returns the status, headers and Anthropic
// error body.
func answer(t *testing.T, base string) (int, http.Header, string, string) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	body := `{"model":"gpt-5.5","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/messages", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var e struct {
		Error struct{ Type, Message string }
	}
	_ = json.Unmarshal(raw, &e)
	return resp.StatusCode, resp.Header, e.Error.Type, e.Error.Message
}

// A fleet data plane without an auth.json whose control plane cannot be
// reached says it waits, and answers turns 503 with retry-after instead
// of failing them for good.
func TestBrokerUnreachable(t *testing.T) {
	s := startSim(t)
	tok := writeAgentToken(t)
	r := startRun(t, nil, "--upstream-url", "ws"+strings.TrimPrefix(s.URL, "http")+codexsim.ChatGPTPath,
		"--control-plane", freeAddr(t), "--agent-token-file", tok)
	code, h, typ, msg := answer(t, r.base)
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || h.Get("X-Should-Retry") != "true" ||
		typ != "api_error" || !strings.Contains(msg, "credential broker") {
		t.Errorf("turn = %d retry-after %q x-should-retry %q %s %q; want 503 api_error with retry-after naming the credential broker",
			code, h.Get("Retry-After"), h.Get("X-Should-Retry"), typ, msg)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(r.stderr.String(), "waiting for the control plane's credential broker") && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if out := r.stderr.String(); strings.Count(out, "waiting for the control plane's credential broker") != 1 {
		t.Errorf("stderr says it waits %d times; want once:\n%s", strings.Count(out, "waiting for the control plane's credential broker"), out)
	}
}

// A sign-in the identity provider refused for good reaches the client as
// a 401 authentication_error telling it an operator must log the account
// in; the data plane never refreshes on its own.
func TestBrokerNeedsLogin(t *testing.T) {
	a, err := simauth.New(simauth.Config{TokenTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := startSimConfig(t, codexsim.Config{Auth: a})
	idp := httptest.NewServer(a.Handler())
	t.Cleanup(idp.Close)
	cp := controlplanetest.Start(t, &controlplanetest.Options{Broker: true, TokenEndpoint: idp.URL + "/oauth/token"})
	issued, err := a.Issue(simAccount)
	if err != nil {
		t.Fatal(err)
	}
	// A stray copy redeems the refresh token first.
	resp, err := http.PostForm(idp.URL+"/oauth/token", url.Values{"grant_type": {"refresh_token"}, "refresh_token": {issued.RefreshToken}, "client_id": {codexauth.DefaultClientID}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	admin := controlplanev1.NewAdminServiceClient(cp.Dial(cp.AdminToken, nil))
	if _, err := admin.ImportLogin(t.Context(), &controlplanev1.ImportLoginRequest{AccessToken: issued.AccessToken, RefreshToken: issued.RefreshToken}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the 1 s access token expires
	r := startRun(t, nil, "--upstream-url", "ws"+strings.TrimPrefix(s.URL, "http")+codexsim.ChatGPTPath,
		"--control-plane", cp.Addr, "--agent-token-file", cp.AgentTokenFile)
	code, h, typ, msg := answer(t, r.base)
	if code != http.StatusUnauthorized || typ != "authentication_error" || !strings.Contains(msg, "clodexctl account login") ||
		h.Get("X-Should-Retry") != "false" {
		t.Errorf("turn = %d %s %q x-should-retry %q; want 401 authentication_error naming clodexctl account login, not retryable", code, typ, msg, h.Get("X-Should-Retry"))
	}
	if st := a.Stats(); st.RefreshReuseDetected != 1 {
		t.Errorf("refresh_reuse_detected = %d; want 1 (the broker presents the dead token once, the data plane never)", st.RefreshReuseDetected)
	}
	for _, secret := range []string{issued.AccessToken, issued.RefreshToken} {
		if strings.Contains(r.stderr.String(), secret) {
			t.Errorf("a token reached the data plane's log")
		}
	}
}

func writeAgentToken(t *testing.T) string {
	t.Helper()
	p := t.TempDir() + "/agent.token"
	if err := os.WriteFile(p, []byte("secret-agent-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
