package pool

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestDecisionRecordsCarryNoContent(t *testing.T) {
	e := newEnv(t, nil)
	pt := Partition{Account: "acct-secret-1234", Model: "gpt-5-codex", Effort: "high", PromptCacheKey: "pck-session"}
	u1 := user("SECRET-USER-TEXT please read /etc/passwd")
	a1 := assistant("SECRET-ASSISTANT-TEXT")
	e.turn(pt, items(u1), "resp_1", items(a1))
	e.clock.Advance(time.Minute)
	rewound := user("SECRET-REWOUND-TEXT")
	e.turn(pt, items(u1, a1, rewound), "resp_2", nil) // continuation
	e.clock.Advance(time.Minute)
	e.turn(pt, items(u1, rewound), "resp_3", nil) // miss: diverges at index 1

	e.diagMu.Lock()
	raw := e.diag.String()
	e.diagMu.Unlock()
	for _, secret := range []string{"SECRET", "acct-secret", "pck-session", "passwd"} {
		if strings.Contains(raw, secret) {
			t.Errorf("diagnostics contain %q:\n%s", secret, raw)
		}
	}
	recs := e.records()
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	first, cont, miss := recs[0], recs[1], recs[2]
	for i, r := range recs {
		if r["event"] != "ws_head_decision" || r["outcome"] != "ok" {
			t.Errorf("record %d event %v outcome %v, want ws_head_decision ok", i, r["event"], r["outcome"])
		}
		if v, ok := r["maxConnections"]; !ok || v != nil {
			t.Errorf("record %d maxConnections = %v (present %v), want null when unbounded", i, v, ok)
		}
		if v, ok := r["maxNurseryConnections"]; !ok || v != nil {
			t.Errorf("record %d maxNurseryConnections = %v (present %v), want null when unbounded", i, v, ok)
		}
		if r["partitionHash"] != first["partitionHash"] || len(r["partitionHash"].(string)) != 16 {
			t.Errorf("record %d partitionHash %v, want the same 16 hex digits", i, r["partitionHash"])
		}
	}
	sum := sha256.Sum256([]byte(pt.Account))
	if first["accountIdHash"] != hex.EncodeToString(sum[:8]) {
		t.Errorf("accountIdHash = %v, want first 16 hex of SHA-256", first["accountIdHash"])
	}
	if first["decision"] != DecisionNewPartition || first["createdConnectionId"] != float64(1) || first["generation"] != GenerationNursery {
		t.Errorf("first record %v, want new_partition_head creating conn 1 in nursery", first)
	}
	if cont["decision"] != DecisionContinuation || cont["selectedConnectionId"] != float64(1) ||
		cont["incrementalInputItems"] != float64(1) || cont["continuationMatchMode"] != "exact" || cont["generation"] != GenerationEstablished {
		t.Errorf("continuation record %v", cont)
	}
	if miss["decision"] != DecisionHistoryMismatch || miss["createdConnectionId"] != float64(2) {
		t.Errorf("miss record decision %v created %v, want history_mismatch_new_head creating 2", miss["decision"], miss["createdConnectionId"])
	}
	heads := miss["heads"].([]any)
	if len(heads) != 1 {
		t.Fatalf("miss record heads %v, want one", heads)
	}
	mm := heads[0].(map[string]any)["mismatch"].(map[string]any)
	expected := sha256.Sum256(a1)
	actual := sha256.Sum256(rewound)
	if mm["firstMismatch"] != float64(1) || mm["expectedPrefixItems"] != float64(3) || mm["fullItems"] != float64(2) ||
		mm["expectedHash"] != hex.EncodeToString(expected[:8]) || mm["actualHash"] != hex.EncodeToString(actual[:8]) ||
		mm["actualKind"] != "message" {
		t.Errorf("mismatch %v, want index 1, 3 expected items, 2 full, hashes of a1 and the rewound item, kind message", mm)
	}
}

func TestDecisionRecordCapsAndEvictions(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxNurseryConnections = 1; c.MaxConnections = 7 })
	e.turn(part("A"), items(user("a")), "ra", nil)
	e.clock.Advance(time.Second)
	e.turn(part("B"), items(user("b")), "rb", nil)
	recs := e.records()
	last := recs[len(recs)-1]
	if last["maxNurseryConnections"] != float64(1) || last["maxConnections"] != float64(7) {
		t.Errorf("caps %v %v, want 1 and 7", last["maxNurseryConnections"], last["maxConnections"])
	}
	ev := last["evictions"].([]any)
	if len(ev) != 1 {
		t.Fatalf("evictions %v, want one", ev)
	}
	got := ev[0].(map[string]any)
	if got["reason"] != EvictNurseryCap || got["connectionId"] != float64(1) || got["generation"] != GenerationNursery || got["partitionHash"] != part("A").hash() {
		t.Errorf("eviction %v, want conn 1 of A, nursery, nursery_lru_cap", got)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, func(c *Config) { c.Registerer = reg })
	pt := part("m")
	e.turn(pt, items(user("u1")), "r1", items(assistant("a1")))
	e.turn(pt, items(user("u1"), assistant("a1"), user("u2")), "r2", nil)
	e.turn(pt, items(user("other")), "r3", nil)
	got := gather(t, reg)
	for series, want := range map[string]float64{
		`clodex_dataplane_pool_decisions_total{decision="continuation"}`:              1,
		`clodex_dataplane_pool_decisions_total{decision="new_partition_head"}`:        1,
		`clodex_dataplane_pool_decisions_total{decision="history_mismatch_new_head"}`: 1,
		`clodex_dataplane_pool_misses_total{reason="history_mismatch"}`:               1,
		`clodex_dataplane_pool_misses_total{reason="no_head"}`:                        1,
		`clodex_dataplane_pool_cached_input_tokens_total{}`:                           270,
		`clodex_dataplane_pool_input_tokens_total{}`:                                  300,
		`clodex_dataplane_pool_heads{generation="established"}`:                       1,
		`clodex_dataplane_pool_heads{generation="nursery"}`:                           1,
		`clodex_dataplane_pool_heads{generation="in_flight"}`:                         0,
	} {
		if v, ok := got[series]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", series, v, ok, want)
		}
	}
	if _, err := New(Config{Credentials: staticCredentials(testCred), Registerer: reg}); err == nil {
		t.Error("second pool on the same registry: want a registration error")
	}
}

// gather flattens reg into "name{k="v",...}" -> value.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", lp.GetName(), lp.GetValue()))
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[mf.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out
}

func TestConfigValidate(t *testing.T) {
	d := staticCredentials(testCred)
	tests := []struct {
		name    string
		cfg     Config
		wantErr []string
	}{
		{"minimal", Config{Credentials: d}, nil},
		{"no credentials", Config{}, []string{"Credentials is required"}},
		{"negative caps and TTL", Config{Credentials: d, MaxConnections: -1, MaxNurseryConnections: -2, IdleTTL: -time.Second},
			[]string{"MaxConnections is -1", "MaxNurseryConnections is -2", "IdleTTL is -1s"}},
		{"rotation after max age", Config{Credentials: d, RotateAge: time.Hour, MaxSocketAge: time.Minute}, []string{"RotateAge 1h0m0s exceeds MaxSocketAge"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want errors %q", tt.wantErr)
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to mention %q", err, w)
				}
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	c := Config{Credentials: staticCredentials(testCred)}.withDefaults()
	if c.NurseryIdleTTL != 5*time.Minute || c.IdleTTL != 30*time.Minute || c.HardTTL != 55*time.Minute ||
		c.RotateAge != 50*time.Minute || c.MaxSocketAge != 58*time.Minute || c.MaxConnections != 0 || c.MaxNurseryConnections != 0 {
		t.Errorf("defaults %+v", c)
	}
	c = Config{Credentials: staticCredentials(testCred), IdleTTL: time.Minute}.withDefaults()
	if c.NurseryIdleTTL != time.Minute {
		t.Errorf("nursery TTL %v, want capped at the idle TTL 1m", c.NurseryIdleTTL)
	}
}

func TestParseCapAndCapsFromEnv(t *testing.T) {
	tests := []struct {
		value   string
		want    int
		wantErr bool
	}{
		{"", 0, false},
		{"1", 1, false},
		{" 4096 ", 4096, false},
		{"100000", 100000, false},
		{"0", 0, true},
		{"-3", 0, true},
		{"12abc", 0, true},
		{"1.5", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseCap(EnvMaxConnections, tt.value)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("ParseCap(%q) = %d, %v; want %d, error %v", tt.value, got, err, tt.want, tt.wantErr)
		}
		if err != nil && !strings.Contains(err.Error(), EnvMaxConnections) {
			t.Errorf("ParseCap(%q) error %q does not name the variable", tt.value, err)
		}
	}
	env := map[string]string{EnvMaxConnections: "64", EnvMaxNurseryConnections: "lots"}
	var notes []string
	est, nur := CapsFromEnv(func(k string) string { return env[k] }, func(m string) { notes = append(notes, m) })
	if est != 64 || nur != 0 || len(notes) != 1 || !strings.Contains(notes[0], EnvMaxNurseryConnections) {
		t.Errorf("CapsFromEnv = %d, %d, notes %q; want 64, 0 and one notice naming %s", est, nur, notes, EnvMaxNurseryConnections)
	}
}
