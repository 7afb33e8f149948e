package codexsim

import (
	"fmt"
	"testing"
)

// ceil4 is the emulator's documented token rule, applied by hand in tests.
func ceil4(s string) int64 { return int64(len(s)+3) / 4 }

// TestTokenAccounting checks input_tokens and cached_tokens on a fresh
// socket, on a continuation and on a full resend, against hand-computed
// canonical JSON lengths.
func TestTokenAccounting(t *testing.T) {
	srv, ts := testServer(t, Config{})
	c := mustDial(t, ts)

	// Key order and whitespace in the frame do not matter: counting uses
	// canonical JSON (sorted keys, compact).
	item1 := `{ "role": "user",  "content": "#sim reply hi" }`
	item1Canon := `{"content":"#sim reply hi","role":"user"}`
	instr := `"be brief"`
	tools := `[{"type":"function","name":"Read","parameters":{"type":"object"}}]`
	toolsCanon := `[{"name":"Read","parameters":{"type":"object"},"type":"function"}]`
	frame1 := `{"type":"response.create","model":"m","instructions":"be brief","tools":` + tools + `,"input":[` + item1 + `]}`
	send(t, c, frame1)
	evs := readResponse(t, c)
	id1 := responseOf(t, last(evs))["id"].(string)
	in1, cached1, out1, _, total1 := usage(t, last(evs))
	fixed := ceil4(instr) + ceil4(toolsCanon)
	if want := ceil4(item1Canon) + fixed; in1 != want || cached1 != 0 {
		t.Errorf("fresh socket: input_tokens=%d cached=%d, want %d and 0", in1, cached1, want)
	}
	msgCanon := fmt.Sprintf(`{"content":[{"annotations":[],"text":"hi","type":"output_text"}],"id":"msg_%s_0","role":"assistant","status":"completed","type":"message"}`, id1[len("resp_"):])
	if want := ceil4(msgCanon); out1 != want || total1 != in1+out1 {
		t.Errorf("output_tokens=%d total=%d, want %d and %d", out1, total1, want, in1+want)
	}

	// Continuation: the socket holds item1 + the reply; only item2 is new.
	item2Canon := `{"content":"#sim reply again","role":"user"}`
	frame2 := `{"type":"response.create","model":"m","instructions":"be brief","tools":` + tools + `,"previous_response_id":"` + id1 + `","input":[` + item2Canon + `]}`
	send(t, c, frame2)
	evs = readResponse(t, c)
	in2, cached2, _, _, _ := usage(t, last(evs))
	if want := ceil4(item1Canon) + ceil4(msgCanon) + ceil4(item2Canon) + fixed; in2 != want {
		t.Errorf("continuation input_tokens = %d, want %d", in2, want)
	}
	if want := in1 + out1; cached2 != want {
		t.Errorf("continuation cached_tokens = %d, want %d (the previous response's input + output)", cached2, want)
	}

	// A full resend on a new socket holds nothing: cached 0.
	c2 := mustDial(t, ts)
	send(t, c2, frame1)
	if _, cached, _, _, _ := usage(t, last(readResponse(t, c2))); cached != 0 {
		t.Errorf("full resend on a new socket: cached_tokens = %d, want 0", cached)
	}
	st := srv.Stats()
	if st.InputTokens != in1+in2+in1 || st.CachedTokens != cached2 {
		t.Errorf("stats input_tokens=%d cached_tokens=%d, want %d and %d", st.InputTokens, st.CachedTokens, in1+in2+in1, cached2)
	}
}

// TestStatsCounting: prewarms count in responses and prewarms, not in
// continued_responses; continuations of a found id count once.
func TestStatsCounting(t *testing.T) {
	srv, ts := testServer(t, Config{})
	c := mustDial(t, ts)
	send(t, c, create("ignored in a prewarm: #sim fail x", map[string]any{"generate": false}))
	evs := readResponse(t, c)
	pre := responseOf(t, last(evs))
	if last(evs)["type"] != "response.completed" || len(pre["output"].([]any)) != 0 {
		t.Fatalf("prewarm = %v, want completed with no output", last(evs))
	}
	// A prewarm continuing a prewarm is still only a prewarm.
	send(t, c, create("x", map[string]any{"generate": false, "previous_response_id": pre["id"]}))
	pre2 := responseOf(t, last(readResponse(t, c)))
	send(t, c, create("#sim reply hi", map[string]any{"previous_response_id": pre2["id"]}))
	r1 := responseOf(t, last(readResponse(t, c)))
	send(t, c, create("#sim reply again", map[string]any{"previous_response_id": r1["id"]}))
	readResponse(t, c)
	send(t, c, create("#sim reply fresh", nil))
	readResponse(t, c)
	send(t, c, create("#sim reply lost", map[string]any{"previous_response_id": "resp_missing"}))
	readResponse(t, c)
	send(t, c, create("#sim fail server_error", nil))
	readResponse(t, c)

	st := srv.Stats()
	checks := []struct {
		name      string
		got, want int64
	}{
		{"upgrades", st.Upgrades, 1},
		{"upgrade_403s", st.Upgrade403s, 0},
		{"open_sockets", st.OpenSockets, 1},
		{"responses", st.Responses, 6},
		{"prewarms", st.Prewarms, 2},
		{"continued_responses", st.ContinuedResponses, 2},
		{"previous_response_not_found", st.PreviousResponseNotFound, 1},
		{"completed_responses", st.CompletedResponses, 5},
		{"errors[previous_response_not_found]", st.Errors["previous_response_not_found"], 1},
		{"errors[server_error]", st.Errors["server_error"], 1},
	}
	for _, ck := range checks {
		if ck.got != ck.want {
			t.Errorf("%s = %d, want %d", ck.name, ck.got, ck.want)
		}
	}
}

// TestUsageByAccount: each account's usage is counted apart, and the
// accounts add up to the totals; a failed response counts nowhere.
func TestUsageByAccount(t *testing.T) {
	srv, ts := testServer(t, Config{AcceptTokens: map[string]string{"tok-a": "acct-a", "tok-b": "acct-b"}})
	var want = map[string]AccountUsage{}
	for _, acct := range []string{"acct-a", "acct-b", "acct-a"} {
		c, status, err := dial(t.Context(), ts, ChatGPTPath, goodHeaders("tok-"+acct[len(acct)-1:], acct))
		if err != nil {
			t.Fatalf("dial %s: status %d: %v", acct, status, err)
		}
		t.Cleanup(func() { _ = c.CloseNow() })
		send(t, c, create("#sim reply hello "+acct, nil))
		in, cached, out, _, _ := usage(t, last(readResponse(t, c)))
		send(t, c, create("#sim fail server_error", nil))
		readResponse(t, c)
		u := want[acct]
		u.CompletedResponses++
		u.InputTokens += in
		u.CachedTokens += cached
		u.OutputTokens += out
		want[acct] = u
	}
	st := srv.Stats()
	if fmt.Sprint(st.UsageByAccount) != fmt.Sprint(want) {
		t.Errorf("usage_by_account = %v, want %v", st.UsageByAccount, want)
	}
	a, b := want["acct-a"], want["acct-b"]
	if st.InputTokens != a.InputTokens+b.InputTokens || st.OutputTokens != a.OutputTokens+b.OutputTokens || st.CompletedResponses != 3 {
		t.Errorf("totals %d in, %d out, %d completed; want the accounts' sums and 3", st.InputTokens, st.OutputTokens, st.CompletedResponses)
	}
}
