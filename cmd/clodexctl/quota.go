package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const quotaUsage = "quota [ACCOUNT | --key KEY]"

var quotaCmd = &command{
	name:  "quota",
	usage: quotaUsage,
	short: "show each account's plan usage (used percent, window length, reset) as the fleet's data planes last read it",
	run:   runQuota,
}

type quotaArgs struct {
	target
}

// quotaView is an account's plan usage as clodexctl prints it; scripts
// rely on the JSON keys. Times are RFC 3339 in UTC.
type quotaView struct {
	Account      string            `json:"account,omitempty"` // the ACCOUNT given, when one was
	Key          string            `json:"key"`
	PlanType     string            `json:"plan_type"`
	LimitReached bool              `json:"limit_reached"`
	Windows      []quotaWindowView `json:"windows"`
	Reported     string            `json:"reported"`
	AgentID      string            `json:"agent_id"`
}

type quotaWindowView struct {
	Name          string  `json:"name"`
	UsedPercent   float64 `json:"used_percent"`
	WindowMinutes int32   `json:"window_minutes"`
	ResetsAt      string  `json:"resets_at,omitempty"` // absent when unknown
	// BurnPercentPerMinute is the window's use per minute over the last
	// 15 minutes of reports; absent when they span under a minute.
	BurnPercentPerMinute *float64 `json:"burn_percent_per_minute,omitempty"`
	// EmptiesInSeconds is when the window is used up at that rate, from
	// now (0: it is); absent when the rate is unknown or 0.
	EmptiesInSeconds *int64 `json:"empties_in_seconds,omitempty"`
}

func runQuota(ctx context.Context, e *env, args []string) error {
	var a quotaArgs
	fs := e.flagSet("quota")
	a.register(fs)
	pos, err := e.parse(fs, quotaUsage, args)
	if err != nil {
		return err
	}
	var label, key string
	if a.key != "" || len(pos) > 0 {
		if label, key, pos, err = a.resolve(pos); err != nil {
			return err
		}
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q; usage: clodexctl %s", pos[0], quotaUsage)
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	resp, err := c.admin.ListQuotas(cctx, &controlplanev1.ListQuotasRequest{Key: key})
	if err != nil {
		return c.rpcError(err, label, key)
	}
	views := make([]quotaView, 0, len(resp.GetQuotas()))
	for _, q := range resp.GetQuotas() {
		v := quotaView{Key: q.GetKey(), PlanType: q.GetPlanType(), LimitReached: q.GetLimitReached(),
			Windows: []quotaWindowView{}, Reported: rfc3339(q.GetReportedUnixMs()), AgentID: q.GetAgentId()}
		if q.GetKey() == key && label != key {
			v.Account = label
		}
		for _, w := range q.GetWindows() {
			wv := quotaWindowView{Name: w.GetName(), UsedPercent: w.GetUsedPercent(), WindowMinutes: w.GetWindowMinutes()}
			if ms := w.GetResetsAtUnixMs(); ms > 0 {
				wv.ResetsAt = rfc3339(ms)
			}
			if w.BurnPercentPerMinute != nil {
				b := w.GetBurnPercentPerMinute()
				wv.BurnPercentPerMinute = &b
			}
			if w.EmptiesInSeconds != nil {
				s := w.GetEmptiesInSeconds()
				wv.EmptiesInSeconds = &s
			}
			v.Windows = append(v.Windows, wv)
		}
		views = append(views, v)
	}
	if e.g.output == "json" {
		return writeJSON(e.stdout, views)
	}
	if len(views) == 0 {
		if key != "" {
			return fmt.Errorf("quota %s: no plan usage reported yet: the account's data planes report it with the first response of each turn", label)
		}
		fmt.Fprintln(e.stdout, "no plan usage reported yet: data planes report it with the first response of each turn")
		return nil
	}
	return writeQuotas(e.stdout, views, time.Now())
}

// writeQuotas prints one row per account and window.
func writeQuotas(w io.Writer, vs []quotaView, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ACCOUNT\tPLAN\tWINDOW\tUSED\tLENGTH\tRESETS AT\tRESETS IN\tBURN\tEMPTIES IN\tLIMIT\tREPORTED")
	for _, v := range vs {
		name := v.Key
		if v.Account != "" {
			name = v.Account
		}
		limit := "-"
		if v.LimitReached {
			limit = "reached"
		}
		if len(v.Windows) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t%s\t%s\n", name, dash(v.PlanType), limit, v.Reported)
			continue
		}
		for _, win := range v.Windows {
			at, in := "-", "-"
			if win.ResetsAt != "" {
				at = win.ResetsAt
				if t, err := time.Parse(time.RFC3339, win.ResetsAt); err == nil {
					in = roundLeft(t.Sub(now))
				}
			}
			burn, empties := burnColumns(win)
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, dash(v.PlanType), win.Name,
				strconv.FormatFloat(win.UsedPercent, 'f', -1, 64), windowLength(win.WindowMinutes), at, in, burn, empties, limit, v.Reported)
		}
	}
	return tw.Flush()
}

// windowLength prints a window's length in minutes as 5h or 7d.
func windowLength(minutes int32) string {
	switch {
	case minutes <= 0:
		return "-"
	case minutes%(24*60) == 0:
		return fmt.Sprintf("%dd", minutes/(24*60))
	case minutes%60 == 0:
		return fmt.Sprintf("%dh", minutes/60)
	}
	return fmt.Sprintf("%dm", minutes)
}

// roundLeft prints the time left until a reset, to the minute ("now" when
// past).
func roundLeft(d time.Duration) string {
	if d <= 0 {
		return "now"
	}
	return d.Round(time.Minute).String()
}

// burnColumns prints a window's burn rate (1.25%/min; - when unknown)
// and when it empties at that rate (to the minute; "now" when it is
// used up, "never" when the rate is 0, - when unknown).
func burnColumns(w quotaWindowView) (burn, empties string) {
	if w.BurnPercentPerMinute == nil {
		return "-", "-"
	}
	burn = strconv.FormatFloat(*w.BurnPercentPerMinute, 'f', 2, 64) + "%/min"
	switch {
	case w.EmptiesInSeconds == nil:
		return burn, "never"
	case *w.EmptiesInSeconds <= 0:
		return burn, "now"
	}
	return burn, roundLeft(time.Duration(*w.EmptiesInSeconds) * time.Second)
}
