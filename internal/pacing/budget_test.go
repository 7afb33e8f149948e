package pacing

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

func dur(d time.Duration) *time.Duration { return &d }
func intp(n int) *int                    { return &n }

// envLookup returns a lookup function over a fixed map.
func envLookup(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

// The eight worked rows of docs/pacing.md §2.1, as literal numbers (never derived from the code).
var budgetRows = []struct {
	name                string
	env                 map[string]string
	idleMs, retries, bo int64
}{
	{"defaults", nil, 120000, 5, 4833},
	{"IDLE=30000", map[string]string{EnvIdleTimeout: "30000"}, 30000, 3, 2000},
	{"IDLE=10000", map[string]string{EnvIdleTimeout: "10000"}, 10000, 2, 666},
	{"IDLE=3600000", map[string]string{EnvIdleTimeout: "3600000"}, 3600000, 5, 15000},
	{"IDLE=600000 TOTAL=60000", map[string]string{EnvIdleTimeout: "600000", EnvTotalTimeout: "60000"}, 60000, 4, 3000},
	{"IDLE=14001", map[string]string{EnvIdleTimeout: "14001"}, 14001, 3, 0},
	{"MAX_RETRIES=0", map[string]string{EnvMaxRetries: "0"}, 120000, 0, 15000},
	{"MAX_RETRIES=99 IDLE=3600000", map[string]string{EnvMaxRetries: "99", EnvIdleTimeout: "3600000"}, 3600000, 10, 15000},
}

func TestBudgetRowsFromEnv(t *testing.T) {
	for _, tt := range budgetRows {
		t.Run(tt.name, func(t *testing.T) {
			p, _ := PolicyFromEnv(envLookup(tt.env))
			b := p.Budget
			got := [3]int64{b.IdleTimeout.Milliseconds(), int64(b.MaxRetries), b.WaitBound.Milliseconds()}
			want := [3]int64{tt.idleMs, tt.retries, tt.bo}
			if got != want {
				t.Errorf("PolicyFromEnv(%v) budget (idle, retries, bound) = %v, want %v", tt.env, got, want)
			}
			if b.WaitBound%time.Millisecond != 0 {
				t.Errorf("WaitBound = %v, want whole milliseconds", b.WaitBound)
			}
		})
	}
}

func TestResolveBudgetRows(t *testing.T) {
	tests := []struct {
		name string
		in   BudgetInput
		want Budget
	}{
		{"defaults", BudgetInput{}, Budget{ms(120000), ms(600000), 5, ms(4833)}},
		{"idle 30000", BudgetInput{IdleTimeout: dur(ms(30000))}, Budget{ms(30000), ms(600000), 3, ms(2000)}},
		{"idle 10000", BudgetInput{IdleTimeout: dur(ms(10000))}, Budget{ms(10000), ms(600000), 2, ms(666)}},
		{"idle 3600000", BudgetInput{IdleTimeout: dur(ms(3600000))}, Budget{ms(3600000), ms(600000), 5, ms(15000)}},
		{"idle 600000 total 60000", BudgetInput{IdleTimeout: dur(ms(600000)), TotalTimeout: dur(ms(60000))}, Budget{ms(60000), ms(60000), 4, ms(3000)}},
		{"idle 14001", BudgetInput{IdleTimeout: dur(ms(14001))}, Budget{ms(14001), ms(600000), 3, 0}},
		{"idle 14000", BudgetInput{IdleTimeout: dur(ms(14000))}, Budget{ms(14000), ms(600000), 2, ms(1333)}},
		{"retries 0", BudgetInput{MaxRetries: intp(0)}, Budget{ms(120000), ms(600000), 0, ms(15000)}},
		{"retries 99 idle 3600000", BudgetInput{IdleTimeout: dur(ms(3600000)), MaxRetries: intp(99)}, Budget{ms(3600000), ms(600000), 10, ms(15000)}},
		{"retries 10 default idle lowered to 5", BudgetInput{MaxRetries: intp(10)}, Budget{ms(120000), ms(600000), 5, ms(4833)}},
		{"retries 2", BudgetInput{MaxRetries: intp(2)}, Budget{ms(120000), ms(600000), 2, ms(15000)}},
		{"retries 1", BudgetInput{MaxRetries: intp(1)}, Budget{ms(120000), ms(600000), 1, ms(15000)}},
		{"retries negative clamps to 0", BudgetInput{MaxRetries: intp(-3)}, Budget{ms(120000), ms(600000), 0, ms(15000)}},
		{"retries 11 clamps to 10", BudgetInput{IdleTimeout: dur(ms(3600000)), MaxRetries: intp(11)}, Budget{ms(3600000), ms(600000), 10, ms(15000)}},
		{"retries 10 exact", BudgetInput{IdleTimeout: dur(ms(3600000)), MaxRetries: intp(10)}, Budget{ms(3600000), ms(600000), 10, ms(15000)}},
		{"idle below 10s clamps", BudgetInput{IdleTimeout: dur(ms(9999))}, Budget{ms(10000), ms(600000), 2, ms(666)}},
		{"idle negative clamps", BudgetInput{IdleTimeout: dur(-time.Hour)}, Budget{ms(10000), ms(600000), 2, ms(666)}},
		{"idle above 1h clamps", BudgetInput{IdleTimeout: dur(ms(3600001))}, Budget{ms(3600000), ms(600000), 5, ms(15000)}},
		{"idle sub-millisecond truncated", BudgetInput{IdleTimeout: dur(ms(30000) + 999*time.Microsecond)}, Budget{ms(30000), ms(600000), 3, ms(2000)}},
		{"unset total never lowers idle", BudgetInput{IdleTimeout: dur(ms(3600000))}, Budget{ms(3600000), ms(600000), 5, ms(15000)}},
		{"total above idle leaves idle", BudgetInput{TotalTimeout: dur(ms(120001))}, Budget{ms(120000), ms(120001), 5, ms(4833)}},
		{"total equal to idle leaves idle", BudgetInput{TotalTimeout: dur(ms(120000))}, Budget{ms(120000), ms(120000), 5, ms(4833)}},
		{"total just below idle lowers it", BudgetInput{TotalTimeout: dur(ms(119999))}, Budget{ms(119999), ms(119999), 5, ms(4833)}},
		{"total below 10s raised first", BudgetInput{TotalTimeout: dur(ms(5000))}, Budget{ms(10000), ms(10000), 2, ms(666)}},
		{"total zero raised", BudgetInput{TotalTimeout: dur(0)}, Budget{ms(10000), ms(10000), 2, ms(666)}},
		{"total exactly 10s", BudgetInput{TotalTimeout: dur(ms(10000))}, Budget{ms(10000), ms(10000), 2, ms(666)}},
		{"ladder equal to idle lowers retries", BudgetInput{IdleTimeout: dur(ms(62000))}, Budget{ms(62000), ms(600000), 4, ms(3200)}},
		{"ladder just below idle keeps retries", BudgetInput{IdleTimeout: dur(ms(62001))}, Budget{ms(62001), ms(600000), 5, 0}},
		{"bound exactly at 15000", BudgetInput{IdleTimeout: dur(ms(242000))}, Budget{ms(242000), ms(600000), 5, ms(15000)}},
		{"bound just below 15000", BudgetInput{IdleTimeout: dur(ms(241999))}, Budget{ms(241999), ms(600000), 5, ms(14999)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := ResolveBudget(tt.in)
			if got != tt.want {
				t.Errorf("ResolveBudget() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestDefaultBudget(t *testing.T) {
	want := Budget{IdleTimeout: 120 * time.Second, TotalTimeout: 600 * time.Second, MaxRetries: 5, WaitBound: 4833 * time.Millisecond}
	if got := DefaultBudget(); got != want {
		t.Errorf("DefaultBudget() = %+v, want %+v", got, want)
	}
	p := DefaultPolicy()
	if p.RatePerMinute != 60 || p.Burst != 10 || p.Budget != want {
		t.Errorf("DefaultPolicy() = %+v, want rate 60 burst 10 budget %+v", p, want)
	}
}

func TestResolveBudgetNotices(t *testing.T) {
	tests := []struct {
		name     string
		in       BudgetInput
		wantKeys []string
	}{
		{"defaults say nothing", BudgetInput{}, nil},
		{"total exactly 10s is not raised", BudgetInput{TotalTimeout: dur(ms(10000)), MaxRetries: intp(2)}, []string{"budget.idle.lowered:10000"}},
		{"total equal to idle says nothing", BudgetInput{TotalTimeout: dur(ms(120000))}, nil},
		{"in-range values say nothing", BudgetInput{IdleTimeout: dur(ms(10000)), TotalTimeout: dur(ms(600000)), MaxRetries: intp(2)}, nil},
		{"idle exactly 1h says nothing", BudgetInput{IdleTimeout: dur(time.Hour), MaxRetries: intp(5)}, nil},
		{"retries exactly 10 say nothing", BudgetInput{IdleTimeout: dur(time.Hour), MaxRetries: intp(10)}, nil},
		{"retries exactly 0 say nothing", BudgetInput{MaxRetries: intp(0)}, nil},
		{"idle exactly 10s says nothing", BudgetInput{IdleTimeout: dur(ms(10000)), MaxRetries: intp(0)}, nil},
		{"idle low", BudgetInput{IdleTimeout: dur(ms(5000)), MaxRetries: intp(2)}, []string{"budget.idle.clamped:5000"}},
		{"idle high", BudgetInput{IdleTimeout: dur(ms(3600001))}, []string{"budget.idle.clamped:3600001"}},
		{"total low", BudgetInput{TotalTimeout: dur(ms(9999)), MaxRetries: intp(2)}, []string{"budget.total.clamped:9999", "budget.idle.lowered:10000"}},
		{"total lowers idle", BudgetInput{TotalTimeout: dur(ms(60000)), MaxRetries: intp(4)}, []string{"budget.idle.lowered:60000"}},
		{"retries high", BudgetInput{IdleTimeout: dur(time.Hour), MaxRetries: intp(11)}, []string{"budget.retries.clamped:11"}},
		{"retries negative", BudgetInput{MaxRetries: intp(-1)}, []string{"budget.retries.clamped:-1"}},
		{"retries lowered by ladder", BudgetInput{IdleTimeout: dur(ms(30000))}, []string{"budget.retries.lowered:3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, notices := ResolveBudget(tt.in)
			var keys []string
			for _, n := range notices {
				keys = append(keys, n.Key)
				if n.Message == "" {
					t.Errorf("notice %q has an empty message", n.Key)
				}
			}
			if strings.Join(keys, ",") != strings.Join(tt.wantKeys, ",") {
				t.Errorf("ResolveBudget() notice keys = %q, want %q", keys, tt.wantKeys)
			}
		})
	}
}

func TestResolveBudgetNoticeMessages(t *testing.T) {
	tests := []struct {
		name string
		in   BudgetInput
		want string
	}{
		{"idle low", BudgetInput{IdleTimeout: dur(ms(5000)), MaxRetries: intp(2)}, "idle timeout 5000ms is below the minimum; using 10000ms"},
		{"idle high", BudgetInput{IdleTimeout: dur(ms(3600001))}, "idle timeout 3600001ms is above the maximum; using 3600000ms"},
		{"total low", BudgetInput{TotalTimeout: dur(ms(9999)), MaxRetries: intp(2)}, "total timeout 9999ms is below the minimum; using 10000ms"},
		{"retries high", BudgetInput{IdleTimeout: dur(time.Hour), MaxRetries: intp(11)}, "max retries 11 is above the maximum; using 10"},
		{"retries negative", BudgetInput{MaxRetries: intp(-1)}, "max retries -1 is below the minimum; using 0"},
		{"lowered", BudgetInput{IdleTimeout: dur(ms(30000))}, "max retries lowered from 5 to 3: a longer backoff ladder does not fit the 30000ms idle timeout"},
		{"idle lowered", BudgetInput{TotalTimeout: dur(ms(60000)), MaxRetries: intp(4)}, "idle timeout lowered from 120000ms to the 60000ms total timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, notices := ResolveBudget(tt.in)
			if len(notices) == 0 || notices[0].Message != tt.want {
				t.Errorf("ResolveBudget() notices = %+v, want first message %q", notices, tt.want)
			}
		})
	}
}

func TestLadderAndRung(t *testing.T) {
	ladder := map[int]int64{-1: 0, 0: 0, 1: 2000, 2: 6000, 3: 14000, 4: 30000, 5: 62000, 10: 2046000, 11: 2046000}
	for r, want := range ladder {
		if got := Ladder(r); got != ms(want) {
			t.Errorf("Ladder(%d) = %v, want %dms", r, got, want)
		}
	}
	rung := map[int]int64{-1: 0, 0: 0, 1: 2000, 2: 4000, 3: 8000, 4: 16000, 5: 32000, 10: 1024000, 11: 1024000}
	for a, want := range rung {
		if got := Rung(a); got != ms(want) {
			t.Errorf("Rung(%d) = %v, want %dms", a, got, want)
		}
	}
}

func TestWaitBoundFor(t *testing.T) {
	tests := []struct {
		idle    time.Duration
		retries int
		want    time.Duration
	}{
		{ms(120000), 5, ms(4833)},
		{ms(14000), 3, 0},
		{ms(13999), 3, 0},
		{ms(14001), 3, 0},
		{ms(14009), 3, ms(1)},
		{ms(14007), 3, 0},
		{ms(14008), 3, ms(1)},
		{ms(120000), -1, ms(15000)},
		{ms(30001), 0, ms(15000)},
		{ms(29999), 0, ms(14999)},
		{ms(3600000), 99, ms(15000)},
		{ms(10000), 2, ms(666)},
	}
	for _, tt := range tests {
		if got := WaitBoundFor(tt.idle, tt.retries); got != tt.want {
			t.Errorf("WaitBoundFor(%v, %d) = %v, want %v", tt.idle, tt.retries, got, tt.want)
		}
	}
}

// TestHintDirect pins the hint at the bounds production uses, with values written out by hand
// (an expected cap computed by the implementation could not catch the implementation's mistake).
func TestHintDirect(t *testing.T) {
	tests := []struct {
		bound time.Duration
		want  time.Duration
	}{
		{ms(4833), 4 * time.Second},
		{ms(15000), 15 * time.Second},
		{ms(666), 1 * time.Second},
		{ms(2000), 2 * time.Second},
		{ms(3000), 3 * time.Second},
		{ms(1999), 1 * time.Second},
		{ms(1000), 1 * time.Second},
		{ms(999), 1 * time.Second},
		{0, 1 * time.Second},
		{ms(14999), 14 * time.Second},
	}
	for _, tt := range tests {
		if got := (Budget{WaitBound: tt.bound}).Hint(); got != tt.want {
			t.Errorf("Budget{WaitBound: %v}.Hint() = %v, want %v", tt.bound, got, tt.want)
		}
	}
}

func TestBudgetValidate(t *testing.T) {
	ok := Budget{IdleTimeout: ms(120000), TotalTimeout: ms(600000), MaxRetries: 5}
	tests := []struct {
		name string
		b    Budget
		want []string // substrings; nil means valid
	}{
		{"valid", ok, nil},
		{"edges valid", Budget{IdleTimeout: ms(10000), TotalTimeout: ms(10000), MaxRetries: 0}, nil},
		{"upper edges valid", Budget{IdleTimeout: ms(3600000), TotalTimeout: ms(10000), MaxRetries: 10}, nil},
		{"idle low", Budget{IdleTimeout: ms(9999), TotalTimeout: ms(600000), MaxRetries: 5}, []string{"idle_timeout_ms 9999 is out of range; allowed 10000..3600000"}},
		{"idle high", Budget{IdleTimeout: ms(3600001), TotalTimeout: ms(600000), MaxRetries: 5}, []string{"idle_timeout_ms 3600001 is out of range; allowed 10000..3600000"}},
		{"total low", Budget{IdleTimeout: ms(120000), TotalTimeout: ms(9999), MaxRetries: 5}, []string{"total_timeout_ms 9999 is out of range; allowed 10000 or more"}},
		{"retries low", Budget{IdleTimeout: ms(120000), TotalTimeout: ms(600000), MaxRetries: -1}, []string{"max_retries -1 is out of range; allowed 0..10"}},
		{"retries high", Budget{IdleTimeout: ms(120000), TotalTimeout: ms(600000), MaxRetries: 11}, []string{"max_retries 11 is out of range; allowed 0..10"}},
		{"all at once", Budget{}, []string{"idle_timeout_ms 0", "total_timeout_ms 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.b.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want error containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
			if tt.name == "all at once" && strings.Contains(err.Error(), "max_retries") {
				t.Errorf("Validate() = %q, max_retries 0 is valid", err)
			}
			var re *RangeError
			if !errors.As(err, &re) {
				t.Errorf("Validate() = %v, want a *RangeError in the chain", err)
			}
		})
	}
}
