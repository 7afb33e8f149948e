package gateway_test

import (
	"encoding/json"
	"testing"
)

// A reasoning item whose summary has several parts reaches the client as ONE thinking
// block, the parts separated by a blank line, signed with the item's encrypted_content;
// sent back, it continues the conversation on its socket. So does the history the data
// plane once produced (one block per part, all but the last with an empty signature).
func TestThinkingHistoryContinues(t *testing.T) {
	for _, old := range []bool{false, true} {
		name := map[bool]string{false: "one signed block", true: "old unsigned parts sent back"}[old]
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, envOptions{})
			c := &conversation{t: t, e: e}
			if got := c.turn("#sim reasoning first part | second part\n#sim reply one"); got != "one" {
				t.Fatalf("turn 1 reply %q, want one", got)
			}
			content := c.messages[len(c.messages)-1].(map[string]any)["content"].([]json.RawMessage)
			var thinking []map[string]string
			for _, raw := range content {
				var b map[string]string
				_ = json.Unmarshal(raw, &b)
				if b["type"] == "thinking" {
					thinking = append(thinking, b)
				}
			}
			if len(thinking) != 1 || thinking[0]["thinking"] != "first part\n\nsecond part" || thinking[0]["signature"] == "" {
				t.Fatalf("thinking blocks %v, want one with %q and a signature", thinking, "first part\n\nsecond part")
			}
			if old {
				sig := thinking[0]["signature"]
				c.messages[len(c.messages)-1] = map[string]any{"role": "assistant", "content": []any{
					map[string]any{"type": "thinking", "thinking": "first part", "signature": ""},
					map[string]any{"type": "thinking", "thinking": "second part", "signature": sig},
					map[string]any{"type": "text", "text": "one"},
				}}
			}
			if got := c.turn("#sim reply two"); got != "two" {
				t.Fatalf("turn 2 reply %q, want two", got)
			}
			if st := e.sim.Stats(); st.Upgrades != 1 || st.ContinuedResponses != 1 || len(st.Errors) != 0 {
				t.Errorf("sim upgrades %d, continued %d, errors %v; want 1, 1 and none: the history continued its socket",
					st.Upgrades, st.ContinuedResponses, st.Errors)
			}
		})
	}
}
