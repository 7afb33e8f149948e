package pacing

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

func noticeKeys(ns []Notice) []string {
	var keys []string
	for _, n := range ns {
		keys = append(keys, n.Key)
	}
	return keys
}

func hasKey(ns []Notice, key string) bool {
	for _, n := range ns {
		if n.Key == key {
			return true
		}
	}
	return false
}

func TestPolicyFromEnvRate(t *testing.T) {
	tests := []struct {
		raw      string
		wantRate int
		wantKey  string // "" means no rate notice
	}{
		{"60", 60, ""},
		{"1", 1, ""},
		{"600", 600, ""},
		{"  30\t", 30, ""},
		{"060", 60, ""},
		{"601", 600, "rate.clamped:601"},
		{"99999999999999999999999", 600, "rate.clamped:99999999999999999999999"},
		{"0", 0, KeyPacingOff},
		{" 0 ", 0, KeyPacingOff},
		{"00", 60, "rate.malformed:00"},
		{"-0", 60, "rate.malformed:-0"},
		{"-5", 60, "rate.malformed:-5"},
		{"+5", 60, "rate.malformed:+5"},
		{"1.5", 60, "rate.malformed:1.5"},
		{"10.0", 60, "rate.malformed:10.0"},
		{"1e3", 60, "rate.malformed:1e3"},
		{"abc", 60, "rate.malformed:abc"},
		{"0x10", 60, "rate.malformed:0x10"},
		{"1 0", 60, "rate.malformed:1 0"},
		{"disabled:3:14001", 60, "rate.malformed:disabled:3:14001"},
		{"", 60, ""},
		{"   ", 60, ""},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q", tt.raw), func(t *testing.T) {
			p, notices := PolicyFromEnv(envLookup(map[string]string{EnvRate: tt.raw}))
			if p.RatePerMinute != tt.wantRate {
				t.Errorf("PolicyFromEnv(%s=%q).RatePerMinute = %d, want %d", EnvRate, tt.raw, p.RatePerMinute, tt.wantRate)
			}
			if p.Burst != 10 {
				t.Errorf("Burst = %d, want 10", p.Burst)
			}
			var rateKeys []string
			for _, k := range noticeKeys(notices) {
				if strings.HasPrefix(k, "rate.") || k == KeyPacingOff {
					rateKeys = append(rateKeys, k)
				}
			}
			want := []string{}
			if tt.wantKey != "" {
				want = []string{tt.wantKey}
			}
			if strings.Join(rateKeys, "|") != strings.Join(want, "|") {
				t.Errorf("rate notices = %q, want %q", rateKeys, want)
			}
			if tt.wantRate == 0 && p.Enabled() {
				t.Errorf("Enabled() = true with rate 0")
			}
		})
	}
}

func TestPolicyFromEnvNoticeMessages(t *testing.T) {
	tests := []struct {
		env  map[string]string
		key  string
		want string
	}{
		{map[string]string{EnvRate: "abc"}, "rate.malformed:abc", `ignoring CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN="abc": not a whole number 0..600; pacing at 60/minute`},
		{map[string]string{EnvRate: "700"}, "rate.clamped:700", "CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN=700 is above the maximum; pacing at 600/minute"},
		{map[string]string{EnvRate: "0"}, KeyPacingOff, "not pacing new OpenAI connections: CLODEX_WS_MAX_NEW_CONNECTIONS_PER_MIN=0"},
		{map[string]string{EnvIdleTimeout: "14001"}, KeyPacingDisabled, "not pacing new OpenAI connections: a 3-retry budget leaves no room to queue inside the resolved 14001ms request deadline"},
		{map[string]string{EnvRate: "1"}, KeyPacingNoRefuse, "pacing new OpenAI connections at 1/minute without refusing overflow: a 5-retry schedule spans only 20000ms, which cannot outlast the 60000ms wait for a free connection slot, so excess connections are admitted late rather than failed"},
		{map[string]string{EnvRate: "29", EnvIdleTimeout: "10000"}, KeyPacingNoRefuse, "pacing new OpenAI connections at 29/minute without refusing overflow: a 2-retry schedule spans only 2000ms, which cannot outlast the 2068ms wait for a free connection slot, so excess connections are admitted late rather than failed"},
		{map[string]string{EnvMaxRetries: "0"}, KeyPacingNoRefuse, "pacing new OpenAI connections at 60/minute without refusing overflow: with retries off nothing would retry a refusal, so excess connections are admitted late rather than failed"},
		{map[string]string{EnvIdleTimeout: "1.5"}, "budget.idle.malformed:1.5", `ignoring CLODEX_UPSTREAM_IDLE_TIMEOUT_MS="1.5": not a whole number of milliseconds`},
		{map[string]string{EnvTotalTimeout: "-1"}, "budget.total.malformed:-1", `ignoring CLODEX_UPSTREAM_TOTAL_TIMEOUT_MS="-1": not a whole number of milliseconds`},
		{map[string]string{EnvMaxRetries: "x"}, "budget.retries.malformed:x", `ignoring CLODEX_UPSTREAM_MAX_RETRIES="x": not a whole number`},
	}
	for _, tt := range tests {
		_, notices := PolicyFromEnv(envLookup(tt.env))
		found := false
		for _, n := range notices {
			if n.Key == tt.key {
				found = true
				if n.Message != tt.want {
					t.Errorf("PolicyFromEnv(%v) notice %q = %q, want %q", tt.env, tt.key, n.Message, tt.want)
				}
			}
		}
		if !found {
			t.Errorf("PolicyFromEnv(%v) notices = %q, want key %q", tt.env, noticeKeys(notices), tt.key)
		}
	}
}

func TestPolicyFromEnvBudgetVariables(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    Budget
		wantKey string
	}{
		{"malformed idle ignored", map[string]string{EnvIdleTimeout: "abc"}, Budget{ms(120000), ms(600000), 5, ms(4833)}, "budget.idle.malformed:abc"},
		{"negative idle ignored", map[string]string{EnvIdleTimeout: "-30000"}, Budget{ms(120000), ms(600000), 5, ms(4833)}, "budget.idle.malformed:-30000"},
		{"zero idle clamps", map[string]string{EnvIdleTimeout: "0"}, Budget{ms(10000), ms(600000), 2, ms(666)}, "budget.idle.clamped:0"},
		{"huge idle clamps", map[string]string{EnvIdleTimeout: "99999999999999999999"}, Budget{ms(3600000), ms(600000), 5, ms(15000)}, "budget.idle.clamped:1000000000000"},
		{"trimmed idle", map[string]string{EnvIdleTimeout: " 30000\n"}, Budget{ms(30000), ms(600000), 3, ms(2000)}, "budget.retries.lowered:3"},
		{"fractional total ignored", map[string]string{EnvTotalTimeout: "60000.5"}, Budget{ms(120000), ms(600000), 5, ms(4833)}, "budget.total.malformed:60000.5"},
		{"total below idle lowers", map[string]string{EnvTotalTimeout: "60000"}, Budget{ms(60000), ms(60000), 4, ms(3000)}, "budget.idle.lowered:60000"},
		{"total tiny raised", map[string]string{EnvTotalTimeout: "1"}, Budget{ms(10000), ms(10000), 2, ms(666)}, "budget.total.clamped:1"},
		{"huge total", map[string]string{EnvTotalTimeout: "99999999999999999999"}, Budget{ms(120000), ms(1000000000000), 5, ms(4833)}, ""},
		{"retries malformed", map[string]string{EnvMaxRetries: "2.0"}, Budget{ms(120000), ms(600000), 5, ms(4833)}, "budget.retries.malformed:2.0"},
		{"retries negative malformed", map[string]string{EnvMaxRetries: "-2"}, Budget{ms(120000), ms(600000), 5, ms(4833)}, "budget.retries.malformed:-2"},
		{"retries huge clamps", map[string]string{EnvMaxRetries: "99999999999999999999", EnvIdleTimeout: "3600000"}, Budget{ms(3600000), ms(600000), 10, ms(15000)}, "budget.retries.clamped:1000000"},
		{"retries 2", map[string]string{EnvMaxRetries: "2"}, Budget{ms(120000), ms(600000), 2, ms(15000)}, ""},
		{"empty values unset", map[string]string{EnvIdleTimeout: "", EnvTotalTimeout: " ", EnvMaxRetries: ""}, Budget{ms(120000), ms(600000), 5, ms(4833)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, notices := PolicyFromEnv(envLookup(tt.env))
			if p.Budget != tt.want {
				t.Errorf("PolicyFromEnv(%v).Budget = %+v, want %+v", tt.env, p.Budget, tt.want)
			}
			if tt.wantKey == "" {
				if len(notices) != 0 {
					t.Errorf("notices = %q, want none", noticeKeys(notices))
				}
			} else if !hasKey(notices, tt.wantKey) {
				t.Errorf("notices = %q, want key %q", noticeKeys(notices), tt.wantKey)
			}
		})
	}
}

func TestPolicyFromEnvDefaultsAndNil(t *testing.T) {
	for name, lookup := range map[string]func(string) (string, bool){
		"nil lookup": nil,
		"empty env":  envLookup(nil),
	} {
		p, notices := PolicyFromEnv(lookup)
		want := Policy{RatePerMinute: 60, Burst: 10, Budget: Budget{ms(120000), ms(600000), 5, ms(4833)}}
		if p != want {
			t.Errorf("%s: PolicyFromEnv() = %+v, want %+v", name, p, want)
		}
		if len(notices) != 0 {
			t.Errorf("%s: notices = %q, want none", name, noticeKeys(notices))
		}
	}
}

func TestPolicyFromEnvModeNotices(t *testing.T) {
	tests := []struct {
		name        string
		env         map[string]string
		wantEnabled bool
		wantRefuse  bool
		wantKey     string
		absentKey   []string
	}{
		{"defaults pace and refuse", nil, true, true, "", []string{KeyPacingDisabled, KeyPacingNoRefuse}},
		{"zero bound disables", map[string]string{EnvIdleTimeout: "14001"}, false, false, KeyPacingDisabled, []string{KeyPacingNoRefuse}},
		{"zero bound with rate 0 says only off", map[string]string{EnvIdleTimeout: "14001", EnvRate: "0"}, false, false, KeyPacingOff, []string{KeyPacingDisabled}},
		{"rate 1 cannot refuse", map[string]string{EnvRate: "1"}, true, false, KeyPacingNoRefuse, []string{KeyPacingDisabled}},
		{"rate 2 cannot refuse", map[string]string{EnvRate: "2"}, true, false, KeyPacingNoRefuse, nil},
		{"rate 3 refuses", map[string]string{EnvRate: "3"}, true, true, "", []string{KeyPacingNoRefuse}},
		{"no retries cannot refuse", map[string]string{EnvMaxRetries: "0"}, true, false, KeyPacingNoRefuse, nil},
		{"rate 29 at 10s cannot refuse", map[string]string{EnvRate: "29", EnvIdleTimeout: "10000"}, true, false, KeyPacingNoRefuse, nil},
		{"rate 30 at 10s refuses", map[string]string{EnvRate: "30", EnvIdleTimeout: "10000"}, true, true, "", []string{KeyPacingNoRefuse}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, notices := PolicyFromEnv(envLookup(tt.env))
			if p.Enabled() != tt.wantEnabled || p.CanRefuse() != tt.wantRefuse {
				t.Errorf("Enabled, CanRefuse = %v, %v; want %v, %v", p.Enabled(), p.CanRefuse(), tt.wantEnabled, tt.wantRefuse)
			}
			if tt.wantKey != "" && !hasKey(notices, tt.wantKey) {
				t.Errorf("notices = %q, want key %q", noticeKeys(notices), tt.wantKey)
			}
			for _, k := range tt.absentKey {
				if hasKey(notices, k) {
					t.Errorf("notices = %q, want no %q", noticeKeys(notices), k)
				}
			}
		})
	}
}

// TestNamespacedNoticeKeys pins a known string: a malformed rate value shaped like
// the disabled notice's key must not suppress the disabled notice.
func TestNamespacedNoticeKeys(t *testing.T) {
	var seen Notices
	var out []string
	emit := func(m string) { out = append(out, m) }
	for _, raw := range []string{"disabled:3:14001", "pacing.disabled", KeyPacingDisabled, "pacing.off", "pacing.norefuse", "pacing.relaxed"} {
		_, notices := PolicyFromEnv(envLookup(map[string]string{EnvRate: raw}))
		for _, n := range notices {
			seen.Emit(n, emit)
		}
	}
	_, notices := PolicyFromEnv(envLookup(map[string]string{EnvIdleTimeout: "14001"}))
	emitted := false
	for _, n := range notices {
		if n.Key == KeyPacingDisabled && seen.Emit(n, emit) {
			emitted = true
		}
	}
	if !emitted {
		t.Errorf("the pacing-disabled notice was suppressed by an earlier malformed value; emitted %q", out)
	}
	// Every value-derived key carries a namespace prefix.
	for _, env := range []map[string]string{
		{EnvRate: "pacing.disabled"}, {EnvRate: "9999"}, {EnvIdleTimeout: "x"}, {EnvIdleTimeout: "5"},
		{EnvTotalTimeout: "y"}, {EnvTotalTimeout: "5"}, {EnvMaxRetries: "z"}, {EnvMaxRetries: "50"},
	} {
		_, ns := PolicyFromEnv(envLookup(env))
		for _, n := range ns {
			if n.Key == KeyPacingDisabled || n.Key == KeyPacingOff || n.Key == KeyPacingNoRefuse || n.Key == KeyCeilingRelaxed {
				t.Errorf("PolicyFromEnv(%v) produced fixed key %q from a value", env, n.Key)
			}
		}
	}
}

func TestNoticesEmit(t *testing.T) {
	var n Notices
	var got []string
	emit := func(m string) { got = append(got, m) }
	if !n.Emit(Notice{Key: "a", Message: "first"}, emit) {
		t.Error("first Emit(a) = false, want true")
	}
	if n.Emit(Notice{Key: "a", Message: "second"}, emit) {
		t.Error("second Emit(a) = true, want false")
	}
	if !n.Emit(Notice{Key: "b", Message: "other"}, nil) {
		t.Error("Emit(b) with nil emit = false, want true")
	}
	if n.Emit(Notice{Key: "b", Message: "other"}, emit) {
		t.Error("Emit(b) after nil emit = true, want false")
	}
	if strings.Join(got, ",") != "first" {
		t.Errorf("emitted %q, want [first]", got)
	}
}

func TestNoticesConcurrent(t *testing.T) {
	var n Notices
	var mu sync.Mutex
	count := 0
	var wg sync.WaitGroup
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.Emit(Notice{Key: "k", Message: "m"}, func(string) {
				mu.Lock()
				count++
				mu.Unlock()
			})
		}()
	}
	wg.Wait()
	if count != 1 {
		t.Errorf("concurrent Emit called emit %d times, want 1", count)
	}
}

func TestPolicyValidate(t *testing.T) {
	good := Policy{RatePerMinute: 60, Burst: 10, Budget: Budget{IdleTimeout: ms(120000), TotalTimeout: ms(600000), MaxRetries: 5}}
	tests := []struct {
		name string
		p    Policy
		want string // "" means valid
	}{
		{"valid", good, ""},
		{"rate 0 valid", Policy{0, 10, good.Budget}, ""},
		{"rate 600 valid", Policy{600, 10, good.Budget}, ""},
		{"burst 1 valid", Policy{60, 1, good.Budget}, ""},
		{"burst 1000 valid", Policy{60, 1000, good.Budget}, ""},
		{"rate 601", Policy{601, 10, good.Budget}, "rate_per_minute 601 is out of range; allowed 0..600"},
		{"rate -1", Policy{-1, 10, good.Budget}, "rate_per_minute -1 is out of range; allowed 0..600"},
		{"burst 0", Policy{60, 0, good.Budget}, "burst 0 is out of range; allowed 1..1000"},
		{"burst 1001", Policy{60, 1001, good.Budget}, "burst 1001 is out of range; allowed 1..1000"},
		{"budget", Policy{60, 10, Budget{IdleTimeout: ms(5000), TotalTimeout: ms(600000)}}, "idle_timeout_ms 5000 is out of range; allowed 10000..3600000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.p.Validate()
			if tt.want == "" {
				if err != nil {
					t.Errorf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Errorf("Validate() = %v, want %q", err, tt.want)
			}
		})
	}
	if err := ValidateRate(601); err == nil || err.Error() != "rate_per_minute 601 is out of range; allowed 0..600" {
		t.Errorf("ValidateRate(601) = %v", err)
	}
	if err := ValidateBurst(0); err == nil || err.Error() != "burst 0 is out of range; allowed 1..1000" {
		t.Errorf("ValidateBurst(0) = %v", err)
	}
	multi := Policy{601, 0, good.Budget}.Validate()
	if multi == nil || !strings.Contains(multi.Error(), "rate_per_minute") || !strings.Contains(multi.Error(), "burst") {
		t.Errorf("Validate() with two bad fields = %v, want both named", multi)
	}
}
