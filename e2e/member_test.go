package e2e

import (
	"crypto/sha256"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/clienttest"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node/nodetest"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// The pinned Claude Code through a member key: a data plane started with
// --member-keys in front of the emulator and a control plane that holds
// the member answers Claude Code sending the key, and its log names the
// member; Claude Code sending a key no member holds is told so, once
// (401, x-should-retry: false: no retry).
func TestClaudeCodeThroughAMemberKey(t *testing.T) {
	bin := clienttest.ClaudeCode(t)
	sim := nodetest.StartSim(t, codexsim.Config{AcceptTokens: map[string]string{simToken: simAccount}})
	cp := controlplanetest.Start(t, nil)
	const key = "clx_e2e-key-of-alice"
	sum := sha256.Sum256([]byte(key))
	admin := controlplanev1.NewAdminServiceClient(cp.Dial(cp.AdminToken, nil))
	if _, err := admin.CreateMember(t.Context(), &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: sum[:]}); err != nil {
		t.Fatal(err)
	}
	cfg := sim.Config(nodetest.WriteAuth(t, simToken, simAccount, ""))
	cfg.ControlPlane, cfg.AgentTokenFile, cfg.MemberKeys = cp.Addr, cp.AgentTokenFile, true
	dp := nodetest.Start(t, cfg)
	client := newClient(t)
	for i := 0; ; i++ { // the member list reaches the data plane on its agent stream
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, dp.URL+"/v1/models", nil)
		req.Header.Set("X-Api-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
		if i == 1000 {
			t.Fatalf("the data plane never served alice's key: %d", resp.StatusCode)
		}
		time.Sleep(10 * time.Millisecond)
	}

	run := func(apiKey, reply string) clienttest.ClaudeResult {
		return clienttest.RunClaude(t.Context(), t, bin, clienttest.ClaudeRun{
			BaseURL: dp.URL, APIKey: apiKey, Model: upstreamModel, Prompt: "#sim reply " + reply,
			ExtraEnv: []string{"CLAUDE_CODE_MAX_RETRIES=0"}, Timeout: claudeTimeout,
		})
	}
	res := run(key, "E2E-MEMBER-OK")
	requireSuccess(t, res)
	if got := res.Text(); got != "E2E-MEMBER-OK" {
		t.Errorf("result text = %q, want E2E-MEMBER-OK", got)
	}
	if logs := dp.Logs.String(); !strings.Contains(logs, "member=alice") || strings.Contains(logs, key) {
		t.Errorf("the data plane's log does not name alice, or holds her key:\n%s", logs)
	}

	res = run("clx_not-a-member", "never")
	if !res.IsError() || !strings.Contains(res.Text()+res.Stderr, "invalid member key") {
		t.Errorf("with a key no member holds: exit %d, is_error %v, result %s; want an error saying the member key is invalid\nstderr:\n%s",
			res.ExitCode, res.IsError(), compact(res.Result), res.Stderr)
	}
	if n := sim.Stats().Responses; n != 1 {
		t.Errorf("the emulator served %d responses; want 1 (alice's): the refused key reached no upstream", n)
	}
}
