package console

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// pageData is what every page template sees.
type pageData struct {
	Title    string
	Operator string
	CSRF     string
	Flash    string
	Live     string // the URL the page's live region is refreshed from
	Overview *overviewView
	Account  *accountView
}

type overviewView struct {
	Sampled     string // "3 s ago"
	Err         string // why the latest read failed (the page shows the last good one)
	Store       string // "redis 10.0.0.5:6379, 2 replicas"
	Degraded    bool
	Accounts    []accountRow
	Agents      []agentRow
	Credentials []credRow
	CredsNote   string
	Members     []memberRow
	MembersNote string
	ByMember    []usageRow // the last 24 hours' usage
	ByAgent     []usageRow
	ByAccount   []usageRow
	UsageNote   string
}

type accountRow struct {
	Key             string
	Plan            string
	Rate, Burst     int32
	Effective       int32
	Tokens          string
	Adaptive        bool
	Paused          string // "paused 40 s more", or ""
	RefusalsPerMin  string
	ForbiddenPerMin string
	Counted         bool
	LimitReached    bool
	Windows         []windowView
}

type windowView struct {
	Name     string
	Used     float64
	Resets   string // "resets in 2h10m"
	Forecast string // "full in 1h05m at 0.8 %/min", "holds until the reset", ""
}

type agentRow struct {
	ID, Host, Version string
	Accounts          []string
	Live              bool
	LastSeen          string
}

type credRow struct {
	Name     string
	Accounts []string
	Created  string
}

type accountView struct {
	Row       accountRow
	Budget    string
	WaitBound string
	Since     string
	Charts    []chart
}

// page wraps a page's handler: security headers, the session (a page
// without one shows how to sign in and nothing of the fleet), and the
// fragment of the live region when the page's script asks for it.
func (c *Console) page(fill func(ctx context.Context, r *http.Request, d *pageData) (int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		ss, ok := c.sessions.get(r)
		if !ok {
			c.render(w, http.StatusUnauthorized, "signin", &pageData{Title: "Sign in"})
			return
		}
		d := &pageData{Operator: ss.operator, CSRF: ss.csrf, Flash: ss.flash}
		code, err := fill(r.Context(), r, d)
		if err != nil {
			c.render(w, code, "error", &pageData{Title: "Error", Operator: ss.operator, CSRF: ss.csrf, Flash: err.Error()})
			return
		}
		name := "overview"
		if d.Account != nil {
			name = "account"
		}
		if r.URL.Query().Get("fragment") == "1" {
			name += "-live"
		}
		c.render(w, code, name, d)
	}
}

func (c *Console) render(w http.ResponseWriter, code int, name string, d *pageData) {
	var buf bytes.Buffer
	if err := c.pages.ExecuteTemplate(&buf, name, d); err != nil {
		c.log.Error("render console page", "page", name, "err", err)
		http.Error(w, "the console could not render this page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

func (c *Console) overview(_ context.Context, _ *http.Request, d *pageData) (int, error) {
	snap := c.sampler.snapshot()
	now := c.cfg.Now()
	v := &overviewView{}
	if snap.at.IsZero() {
		v.Sampled = "not read yet"
	} else {
		v.Sampled = ago(now.Sub(snap.at))
	}
	if snap.err != nil {
		v.Err = snap.err.Error()
	}
	if st := snap.store; st != nil {
		v.Store = fmt.Sprintf("%s %s", st.GetKind(), st.GetAddress())
		if st.GetKind() == "redis" {
			v.Store += fmt.Sprintf(", %d live replicas, this one %s", st.GetReplicas(), st.GetReplica())
		}
		v.Degraded = st.GetDegraded()
	}
	for _, a := range snap.accounts {
		v.Accounts = append(v.Accounts, c.row(now, a, snap.quotas[a.GetKey()]))
	}
	for _, a := range snap.agents {
		v.Agents = append(v.Agents, agentRow{ID: a.GetId(), Host: a.GetHost(), Version: a.GetVersion(), Accounts: a.GetAccounts(),
			Live: a.GetLive(), LastSeen: ago(now.Sub(time.UnixMilli(a.GetLastSeenUnixMs())))})
	}
	for _, cr := range snap.creds {
		v.Credentials = append(v.Credentials, credRow{Name: cr.GetName(), Accounts: cr.GetAccounts(),
			Created: time.UnixMilli(cr.GetCreatedUnixMs()).UTC().Format(time.RFC3339)})
	}
	if snap.credsErr != nil {
		v.CredsNote = status.Convert(snap.credsErr).Message()
	}
	pp := snap.people
	v.Members, v.MembersNote = memberRows(pp.members), errNote("members", pp.membersErr)
	v.ByMember = usageRows(pp.byMember, (*controlplanev1.UsageTotals).GetMember)
	v.ByAgent = usageRows(pp.byAgent, (*controlplanev1.UsageTotals).GetAgent)
	v.ByAccount = usageRows(pp.byAccount, (*controlplanev1.UsageTotals).GetAccount)
	v.UsageNote = errNote("usage", pp.usageErr)
	d.Title, d.Overview, d.Live = "Fleet", v, "/console/?fragment=1"
	return http.StatusOK, nil
}

func (c *Console) account(ctx context.Context, r *http.Request, d *pageData) (int, error) {
	key := r.PathValue("key")
	resp, err := c.cfg.Admin.GetAccount(ctx, &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		st := status.Convert(err)
		code := http.StatusBadGateway
		switch st.Code() {
		case codes.NotFound:
			code = http.StatusNotFound
		case codes.InvalidArgument:
			code = http.StatusBadRequest
		}
		return code, fmt.Errorf("account %s: %s", key, st.Message())
	}
	a := resp.GetAccount()
	now := c.cfg.Now()
	snap := c.sampler.snapshot()
	v := &accountView{Row: c.row(now, a, snap.quotas[a.GetKey()]),
		Budget: fmt.Sprintf("idle %s, total %s, %d retries", time.Duration(a.GetIdleTimeoutMs())*time.Millisecond,
			time.Duration(a.GetTotalTimeoutMs())*time.Millisecond, a.GetMaxRetries()),
		WaitBound: (time.Duration(a.GetWaitBoundMs()) * time.Millisecond).String(),
	}
	if a.GetCountersSinceUnixMs() > 0 {
		v.Since = time.UnixMilli(a.GetCountersSinceUnixMs()).UTC().Format(time.RFC3339)
	}
	if hours := c.sampler.hoursOf(a.GetKey(), now); len(hours) > 0 {
		v.Charts = append(v.Charts, chart{Title: "Tokens per hour (the usage ledger): input not cached, cached, output", SVG: drawHours(now, hours)})
	}
	if sr := c.sampler.seriesOf(key); sr != nil {
		// The history's points are 5 minutes apart; the charts end with
		// the account as it is now.
		rf, fb := sr.perMinute()
		cur := point{At: now, Tokens: a.GetTokens(), Rate: a.GetRatePerMinute(), Effective: a.GetEffectiveRatePerMinute(),
			RefusalsPerMin: rf, ForbiddenPerMin: fb, Used: map[string]float64{}}
		for _, w := range snap.quotas[a.GetKey()].GetWindows() {
			cur.Used[w.GetName()] = w.GetUsedPercent()
		}
		v.Charts = append(v.Charts, charts(now, append(sr.history, cur))...)
	}
	d.Title, d.Account, d.Live = a.GetKey(), v, "/console/account/"+a.GetKey()+"?fragment=1"
	return http.StatusOK, nil
}

// row is one account as the pages show it.
func (c *Console) row(now time.Time, a *controlplanev1.Account, q *controlplanev1.AccountQuota) accountRow {
	row := accountRow{Key: a.GetKey(), Plan: q.GetPlanType(), Rate: a.GetRatePerMinute(), Burst: a.GetBurst(),
		Effective: a.GetEffectiveRatePerMinute(), Adaptive: a.GetAdaptive(), Counted: a.GetCounted(),
		LimitReached: q.GetLimitReached(), RefusalsPerMin: "–", ForbiddenPerMin: "–"}
	if t := a.GetTokens(); t < 0 {
		row.Tokens = fmt.Sprintf("%.1f owed", -t)
	} else {
		row.Tokens = fmt.Sprintf("%.1f", t)
	}
	if p := a.GetPausedUntilUnixMs(); p > 0 {
		if d := time.UnixMilli(p).Sub(now); d > 0 {
			row.Paused = "paused " + roundDur(d) + " more"
		}
	}
	sr := c.sampler.seriesOf(a.GetKey())
	if sr != nil && a.GetCounted() {
		rf, fb := sr.perMinute()
		row.RefusalsPerMin, row.ForbiddenPerMin = fmt.Sprintf("%.1f", rf), fmt.Sprintf("%.1f", fb)
	}
	for _, w := range q.GetWindows() {
		wv := windowView{Name: w.GetName(), Used: w.GetUsedPercent()}
		var resetIn time.Duration
		if ms := w.GetResetsAtUnixMs(); ms > 0 {
			resetIn = time.UnixMilli(ms).Sub(now)
			if resetIn > 0 {
				wv.Resets = "resets in " + roundDur(resetIn)
			} else {
				wv.Resets = "reset due"
			}
		}
		wv.Forecast = forecast(w, resetIn)
		row.Windows = append(row.Windows, wv)
	}
	return row
}

// forecast says when a window fills at its burn rate over the last 15
// minutes (as ListQuotas computes it, the figures clodexctl quota shows),
// or that it holds until its reset.
func forecast(w *controlplanev1.QuotaWindow, resetIn time.Duration) string {
	switch {
	case w.BurnPercentPerMinute == nil:
		return ""
	case w.GetUsedPercent() >= 100:
		return "full"
	case w.EmptiesInSeconds == nil:
		return "not rising"
	}
	burn := w.GetBurnPercentPerMinute()
	full := time.Duration(w.GetEmptiesInSeconds()) * time.Second
	if resetIn > 0 && full >= resetIn {
		return fmt.Sprintf("holds until the reset at %.2f %%/min", burn)
	}
	return fmt.Sprintf("full in %s at %.2f %%/min", roundDur(full), burn)
}

func ago(d time.Duration) string {
	if d < time.Second {
		return "just now"
	}
	return roundDur(d) + " ago"
}

// roundDur prints a duration the way a person reads it: 45s, 12m, 2h10m, 3d4h.
func roundDur(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(math.Round(d.Seconds())))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// usageTableData is what the usage-table template draws.
type usageTableData struct {
	Title, Class string
	Rows         []usageRow
}

var funcs = template.FuncMap{
	"usageTable": func(title, class string, rows []usageRow) usageTableData {
		return usageTableData{Title: title, Class: class, Rows: rows}
	},
	"pct":   func(v float64) float64 { return math.Max(0, math.Min(100, v)) },
	"join":  func(s []string) string { return strings.Join(s, ", ") },
	"short": func(s []string) string { return shortList(s, 3) },
}

func shortList(s []string, n int) string {
	if len(s) <= n {
		return strings.Join(s, ", ")
	}
	return strings.Join(slices.Clip(s[:n]), ", ") + fmt.Sprintf(" and %d more", len(s)-n)
}
