package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/controlplane/store/redistest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/codexsim"
	"github.com/clodex/clodex/internal/node/nodetest"
)

// usageRow is one row of clodexctl usage -o json.
type usageRow struct {
	Agent        string `json:"agent"`
	Account      string `json:"account"`
	Model        string `json:"model"`
	Turns        int64  `json:"turns"`
	InputTokens  int64  `json:"input_tokens"`
	CachedTokens int64  `json:"cached_tokens"`
	OutputTokens int64  `json:"output_tokens"`
	NewSockets   int64  `json:"new_sockets"`
	Refusals     int64  `json:"refusals"`
}

func usageRows(t *testing.T, srv *controlplanetest.Server, by string) []usageRow {
	t.Helper()
	out, _, err := ctl(t, srv, "usage", "--by", by, "-o", "json")
	if err != nil {
		t.Fatalf("clodexctl usage --by %s: %v", by, err)
	}
	var v struct{ Rows []usageRow }
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("clodexctl usage -o json: %v\n%s", err, out)
	}
	return v.Rows
}

// conversation runs turns of one Claude-Code-like conversation against a
// data plane, each turn resending the whole conversation (so a turn after
// the first continues its socket when it can).
func conversation(t *testing.T, client *http.Client, base, session, model string, turns int) {
	var msgs []map[string]any
	for i := range turns {
		msgs = append(msgs, map[string]any{"role": "user", "content": fmt.Sprintf("#sim reply answer %d of %s", i, session)})
		body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 256, "messages": msgs})
		for attempt := 0; ; attempt++ {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("X-Claude-Code-Session-Id", session)
			resp, err := client.Do(req)
			if err != nil {
				t.Errorf("turn %d of %s: %v", i, session, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				var m struct {
					Content []struct{ Text string } `json:"content"`
				}
				_ = json.Unmarshal(b, &m)
				text := ""
				if len(m.Content) > 0 {
					text = m.Content[0].Text
				}
				msgs = append(msgs, map[string]any{"role": "assistant", "content": text})
				break
			}
			if resp.StatusCode >= 500 && attempt < 5 { // a control plane restarting mid-turn is retried, as clients do
				time.Sleep(200 * time.Millisecond)
				continue
			}
			t.Errorf("turn %d of %s: status %d: %s", i, session, resp.StatusCode, b)
			return
		}
	}
}

// The usage pipeline through real parts, in process: clodex-sim with two
// accounts, a control plane (the memory store with its data dir, or
// Redis), two data planes joined to it serving both accounts, and
// conversations on both; the control plane restarts mid-run (every data
// plane's stream reconnects, and whatever batch was in flight is sent
// again). The ledger's totals per account then equal what the emulator
// counted: turns (its completed responses), input, cached and output
// tokens, and new sockets (its upgrades); each data plane is one agent.
func TestUsagePipeline(t *testing.T) {
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) { usagePipeline(t, store) })
	}
}

func usagePipeline(t *testing.T, store string) {
	sim := nodetest.StartSim(t, codexsim.Config{AcceptTokens: map[string]string{"tok-a": "acct-a", "tok-b": "acct-b"}})
	opts := &controlplanetest.Options{}
	if store == "redis" {
		opts.RedisURL = redistest.Start(t).URL
	}
	srv := controlplanetest.Start(t, opts)
	var urls []string
	for range 2 {
		cfg := sim.Config(nodetest.WriteAuth(t, "tok-a", "acct-a", ""))
		cfg.ExtraCodexAuth = []string{nodetest.WriteAuth(t, "tok-b", "acct-b", "")}
		cfg.ControlPlane, cfg.AgentTokenFile, cfg.Refresh = srv.Addr, srv.AgentTokenFile, "never"
		cfg.UsageFlush = time.Second
		urls = append(urls, nodetest.Start(t, cfg).URL)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	t.Cleanup(client.CloseIdleConnections)
	models := []string{"claude-sonnet-4-5-20250929", "claude-haiku-4-5-20251001", "gpt-5.5"}
	run := func(round int) {
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				conversation(t, client, urls[i%2], fmt.Sprintf("%s-r%d-c%d", store, round, i), models[i%3], 3)
			}()
		}
		wg.Wait()
	}
	run(0)
	srv.Restart()
	run(1)
	if t.Failed() {
		return
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		st := sim.Stats()
		rows := usageRows(t, srv, "account")
		got := map[string]usageRow{}
		var total usageRow
		for _, r := range rows {
			got[r.Account] = r
			total.Turns += r.Turns
			total.NewSockets += r.NewSockets
		}
		ok := total.Turns == st.CompletedResponses && total.NewSockets == st.Upgrades
		for _, id := range []string{"acct-a", "acct-b"} {
			u, r := st.UsageByAccount[id], got[account.Key(id)]
			ok = ok && r.Turns == u.CompletedResponses && r.InputTokens == u.InputTokens && r.CachedTokens == u.CachedTokens && r.OutputTokens == u.OutputTokens
		}
		if ok {
			t.Logf("ledger by account %+v; emulator %+v, %d upgrades", rows, st.UsageByAccount, st.Upgrades)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ledger never matched the emulator:\nledger by account %+v (total turns %d, new sockets %d)\nemulator %+v, %d completed, %d upgrades",
				rows, total.Turns, total.NewSockets, st.UsageByAccount, st.CompletedResponses, st.Upgrades)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st := sim.Stats(); st.CompletedResponses != 36 {
		t.Errorf("the emulator completed %d responses, want 36 (12 conversations of 3 turns)", st.CompletedResponses)
	}
	agents := usageRows(t, srv, "agent")
	if len(agents) != 2 || agents[0].Turns+agents[1].Turns != 36 || agents[0].Turns != 18 {
		t.Errorf("by agent = %+v; want two agents of 18 turns each", agents)
	}
	table, _, err := ctl(t, srv, "usage", "--by", "agent,account,model")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("clodexctl usage --by agent,account,model:\n%s", table)
}
