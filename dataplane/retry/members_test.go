package retry

import (
	"net/http"
	"testing"
	"time"
)

// Stand-ins for the other packages' errors, known here by their methods
// (control.RefusedError, accounts.NotAllowedError,
// accounts.ChosenLimitedError).
type (
	capRefusal struct{ member string }
	notHere    struct{}
	pinLimited struct{ at time.Time }
)

func (capRefusal) Error() string               { return "refused" }
func (capRefusal) PacerRefusal() time.Duration { return 4 * time.Second }
func (c capRefusal) MemberCap() (string, int)  { return c.member, 3 }
func (notHere) Error() string                  { return "not here" }
func (notHere) NotAllowed() string             { return "Member alice may not use account acct_x" }
func (pinLimited) Error() string               { return "limited" }
func (p pinLimited) Limited() (string, time.Time, time.Duration) {
	return "Member bob is pinned to account acct_y, which is at its usage limit", p.at, 2 * time.Hour
}

// The rows of the failure table for members: a member's cap refusal is a
// pacer refusal named after the member; an account a turn may not use is
// 403 never worth a retry; the account chosen for it at its usage limit is
// 429 with the reset, as one usage limit.
func TestClassifyMembers(t *testing.T) {
	at := time.Date(2026, 12, 1, 14, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name      string
		err       error
		class     Class
		status    int
		typ       string
		msg       string
		permanent bool
	}{
		{"member's cap", capRefusal{"alice"}, Refused, 429, "rate_limit_error",
			"Member alice's cap of 3 new upstream connections a minute (clodexctl member create --rate) refused this request; retry after 4s", false},
		{"account's bucket", capRefusal{""}, Refused, 429, "rate_limit_error",
			"The fleet's pacing of new upstream connections refused this request; retry after 4s", false},
		{"not allowed", notHere{}, Fatal, 403, "permission_error", "Member alice may not use account acct_x", true},
		{"pin limited", pinLimited{at}, Fatal, 429, "rate_limit_error", "Member bob is pinned to account acct_y, which is at its usage limit", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := Classify(tt.err, Facts{})
			ue, ok := f.Err.(*UpstreamError)
			if f.Class != tt.class || !ok || ue.Status != tt.status || ue.Type != tt.typ || ue.Message != tt.msg || ue.Permanent != tt.permanent {
				t.Fatalf("Classify = %v %+v; want %v %d %s %q permanent %v", f.Class, f.Err, tt.class, tt.status, tt.typ, tt.msg, tt.permanent)
			}
			h := http.Header{}
			_ = Answer(h, ue, Facts{Now: at.Add(-2 * time.Hour)}, func() float64 { return 0.5 })
			if tt.name == "pin limited" && (h.Get("X-Should-Retry") != "false" || h.Get(HeaderRequestsReset) != "2026-12-01T14:00:00Z") {
				t.Errorf("headers %v; want x-should-retry false and the reset", h)
			}
			if tt.name == "not allowed" && h.Get("X-Should-Retry") != "false" {
				t.Errorf("headers %v; want x-should-retry false", h)
			}
		})
	}
}
