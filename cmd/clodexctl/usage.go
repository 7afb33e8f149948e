package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const usageUsage = "usage [--by member|agent|account|model[,...]] [--since D]"

var usageCmd = &command{
	name:  "usage",
	usage: usageUsage,
	short: "show who used what: turns, tokens, new sockets and refusals from the usage ledger, grouped (default by member, over the last 24h)",
	run:   runUsage,
}

// The ledger keeps 30 days.
const maxUsageSince = 30 * 24 * time.Hour

type usageArgs struct {
	by    string
	since string
}

// usageRowView is one row as clodexctl prints it in JSON; scripts rely on
// the keys. A key not grouped by is absent.
type usageRowView struct {
	Member       *string `json:"member,omitempty"`
	Agent        *string `json:"agent,omitempty"`
	Account      *string `json:"account,omitempty"`
	Model        *string `json:"model,omitempty"`
	Turns        int64   `json:"turns"`
	InputTokens  int64   `json:"input_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	NewSockets   int64   `json:"new_sockets"`
	Refusals     int64   `json:"refusals"`
}

type usageView struct {
	Rows []usageRowView `json:"rows"`
}

// parseSince reads --since: a Go duration (90m, 2h) or whole days (7d),
// above 0 and at most 30 days.
func parseSince(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if days, ok := strings.CutSuffix(v, "d"); ok && err != nil {
		n, nerr := strconv.Atoi(days)
		d, err = time.Duration(n)*24*time.Hour, nerr
	}
	if err != nil || d <= 0 || d > maxUsageSince {
		return 0, usagef("--since %q is invalid; want a duration above 0 and at most 30d (the ledger keeps 30 days), such as 15m, 24h or 7d", v)
	}
	return d, nil
}

// parseBy reads --by: usage keys, comma-separated, each once.
func parseBy(v string) ([]string, error) {
	allowed := []string{"member", "agent", "account", "model"}
	var out []string
	for _, k := range strings.Split(v, ",") {
		k = strings.TrimSpace(k)
		switch {
		case !slices.Contains(allowed, k):
			return nil, usagef("--by %q: %q is not a key; allowed member, agent, account, model (comma-separated)", v, k)
		case slices.Contains(out, k):
			return nil, usagef("--by %q names %s twice", v, k)
		}
		out = append(out, k)
	}
	return out, nil
}

func runUsage(ctx context.Context, e *env, args []string) error {
	var a usageArgs
	fs := e.flagSet("usage")
	fs.StringVar(&a.by, "by", "member", "group by these `keys`: member, agent, account, model, comma-separated")
	fs.StringVar(&a.since, "since", "24h", "sum the last `D` (15m, 24h, 7d; at most 30d)")
	pos, err := e.parse(fs, usageUsage, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q; usage: clodexctl %s", pos[0], usageUsage)
	}
	by, err := parseBy(a.by)
	if err != nil {
		return err
	}
	since, err := parseSince(a.since)
	if err != nil {
		return err
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	resp, err := c.admin.GetUsage(cctx, &controlplanev1.GetUsageRequest{GroupBy: by, SinceUnixMs: time.Now().Add(-since).UnixMilli()})
	if err != nil {
		return c.rpcError(err, "", "")
	}
	v := usageViewOf(resp, by)
	if e.g.output == "json" {
		return writeJSON(e.stdout, v)
	}
	if resp.GetTruncated() {
		fmt.Fprintf(e.stderr, "clodexctl: warning: more than %d groups; the rest are summed in the row named other\n", len(resp.GetRows())-1)
	}
	return writeUsage(e.stdout, v, by)
}

// usageViewOf keeps the grouped-by keys of each row.
func usageViewOf(resp *controlplanev1.GetUsageResponse, by []string) usageView {
	v := usageView{Rows: make([]usageRowView, 0, len(resp.GetRows()))}
	for _, r := range resp.GetRows() {
		rv := usageRowView{Turns: r.GetTurns(), InputTokens: r.GetInputTokens(), CachedTokens: r.GetCachedTokens(),
			OutputTokens: r.GetOutputTokens(), NewSockets: r.GetNewSockets(), Refusals: r.GetRefusals()}
		for _, k := range by {
			switch k {
			case "member":
				rv.Member = ptr(r.GetMember())
			case "agent":
				rv.Agent = ptr(r.GetAgent())
			case "account":
				rv.Account = ptr(r.GetAccount())
			case "model":
				rv.Model = ptr(r.GetModel())
			}
		}
		v.Rows = append(v.Rows, rv)
	}
	return v
}

func ptr(s string) *string { return &s }

// writeUsage prints one row per group, the keys in --by's order, and a
// total when there is more than one row.
func writeUsage(w io.Writer, v usageView, by []string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := make([]string, 0, len(by)+6)
	for _, k := range by {
		head = append(head, strings.ToUpper(k))
	}
	head = append(head, "TURNS", "INPUT", "CACHED", "OUTPUT", "NEW SOCKETS", "REFUSALS")
	line := func(cells []string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	line(head)
	var total usageRowView
	for _, r := range v.Rows {
		cells := make([]string, 0, len(head))
		for _, k := range by {
			cells = append(cells, dash(r.key(k)))
		}
		line(append(cells, counts(r)...))
		total.Turns += r.Turns
		total.InputTokens += r.InputTokens
		total.CachedTokens += r.CachedTokens
		total.OutputTokens += r.OutputTokens
		total.NewSockets += r.NewSockets
		total.Refusals += r.Refusals
	}
	if len(v.Rows) == 0 {
		line(append(slices.Repeat([]string{"-"}, len(by)), counts(total)...))
	}
	if len(v.Rows) > 1 {
		cells := append([]string{"TOTAL"}, slices.Repeat([]string{""}, len(by)-1)...)
		line(append(cells, counts(total)...))
	}
	return tw.Flush()
}

func counts(r usageRowView) []string {
	return []string{strconv.FormatInt(r.Turns, 10), strconv.FormatInt(r.InputTokens, 10), strconv.FormatInt(r.CachedTokens, 10),
		strconv.FormatInt(r.OutputTokens, 10), strconv.FormatInt(r.NewSockets, 10), strconv.FormatInt(r.Refusals, 10)}
}

// key returns the row's value of the usage key k ("" when absent).
func (r usageRowView) key(k string) string {
	p := map[string]*string{"member": r.Member, "agent": r.Agent, "account": r.Account, "model": r.Model}[k]
	if p == nil {
		return ""
	}
	return *p
}
