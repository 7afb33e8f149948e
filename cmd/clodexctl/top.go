package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const topUsage = "top [--interval D] [--once]"

var topCmd = &command{
	name:  "top",
	usage: topUsage,
	short: "a live view per account: rates, tokens, admissions, waits, refusals and 403s per minute, agents, plan usage",
	run:   runTop,
}

type topArgs struct {
	interval time.Duration
	once     bool
}

// topSample is one poll of the control plane.
type topSample struct {
	at       time.Time
	accounts []*controlplanev1.Account
	agents   []*controlplanev1.Agent
	quotas   map[string]*controlplanev1.AccountQuota // nil from a control plane without quotas
	// quotaErr is why the plan usage could not be read (the store is
	// degraded); nil when it was.
	quotaErr error
	store    *storeView
}

// topRow is one account as top prints it. Per-minute fields are nil
// until two samples of the same replica's counters exist.
type topRow struct {
	Key             string
	Rate, Effective int32
	Adaptive        bool
	Tokens          float64
	// Admits counts every admission, at once or after a wait; Waits
	// those that waited.
	Admits, Waits, Refusals   *float64 // per minute
	Forbidden                 *float64 // upstream 403s per minute
	ForbiddenTotal            int64
	Counted                   bool
	LiveAgents, AgentsServing int
	// Quota is the tightest window of the account's plan, "29% 7d", "-"
	// when none was reported, "?" when it could not be read.
	Quota string
	// Unreadable says the account's stored policy does not decode.
	Unreadable string
}

func runTop(ctx context.Context, e *env, args []string) error {
	a := topArgs{interval: 2 * time.Second}
	fs := e.flagSet("top")
	fs.DurationVar(&a.interval, "interval", a.interval, "time between polls (500ms..1m)")
	fs.BoolVar(&a.once, "once", false, "print one view, over one --interval, and exit")
	pos, err := parseArgs(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return usagef("usage: clodexctl %s", topUsage)
	}
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usagef("unexpected argument %q; top takes no arguments", pos[0])
	}
	if e.g.output != "table" {
		return usagef("-o %s: top prints a table only; clodexctl accounts -o json and agents -o json give the same data", e.g.output)
	}
	if a.interval < 500*time.Millisecond || a.interval > time.Minute {
		return usagef("--interval %v is out of range; allowed 500ms..1m", a.interval)
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()

	tty := isTerminal(e.stdout)
	if tty && !a.once {
		fmt.Fprint(e.stdout, "\x1b[?1049h\x1b[?25l") // alternate screen, hide the cursor
		defer fmt.Fprint(e.stdout, "\x1b[?25h\x1b[?1049l")
	}
	var prev *topSample
	tick := time.NewTicker(a.interval)
	defer tick.Stop()
	for frame := 0; ; frame++ {
		cur, err := e.topPoll(ctx, c)
		var lastErr error
		if err != nil {
			st := status.Convert(err)
			if st.Code() == codes.Unauthenticated || st.Code() == codes.PermissionDenied || ctx.Err() != nil {
				if ctx.Err() != nil {
					return nil // Ctrl-C
				}
				return c.rpcError(err, "", "")
			}
			lastErr = c.rpcError(err, "", "")
		}
		if a.once && frame == 0 && err == nil {
			prev = cur
		} else {
			var b strings.Builder
			if tty && !a.once {
				b.WriteString("\x1b[H\x1b[2J") // home, clear
			}
			if cur == nil {
				cur = prev
			}
			writeTop(&b, c.addr, a.interval, time.Now(), topRows(prev, cur), cur, lastErr)
			if _, err := io.WriteString(e.stdout, b.String()); err != nil {
				return err
			}
			if a.once {
				if lastErr != nil {
					return lastErr
				}
				return nil
			}
			if lastErr == nil {
				prev = cur
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// topPoll reads the accounts and the agents once.
func (e *env) topPoll(ctx context.Context, c *client) (*topSample, error) {
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	accts, info, err := listAccounts(cctx, c)
	if err != nil {
		return nil, err
	}
	agents, err := listAgents(cctx, c)
	if err != nil {
		return nil, err
	}
	smp := &topSample{at: time.Now(), accounts: accts, agents: agents, store: storeOf(info)}
	q, err := c.admin.ListQuotas(cctx, &controlplanev1.ListQuotasRequest{})
	switch status.Code(err) {
	case codes.OK:
		smp.quotas = map[string]*controlplanev1.AccountQuota{}
		for _, aq := range q.GetQuotas() {
			smp.quotas[aq.GetKey()] = aq
		}
	case codes.Unimplemented: // an older control plane keeps no plan usage
	default:
		smp.quotaErr = err
	}
	return smp, nil
}

// tightest prints the window of q with the highest used percent: "29% 7d"
// ("LIMIT" when the backend says the limit is reached), "-" for none.
func tightest(q *controlplanev1.AccountQuota) string {
	if q == nil {
		return "-"
	}
	if q.GetLimitReached() {
		return "LIMIT"
	}
	var best *controlplanev1.QuotaWindow
	for _, w := range q.GetWindows() {
		if best == nil || w.GetUsedPercent() > best.GetUsedPercent() {
			best = w
		}
	}
	if best == nil {
		return "-"
	}
	return strconv.FormatFloat(best.GetUsedPercent(), 'f', 0, 64) + "% " + windowLength(best.GetWindowMinutes())
}

// topRows builds the rows of cur; per-minute rates come from the counter
// deltas since prev when both samples are of the same replica's counters.
func topRows(prev, cur *topSample) []topRow {
	if cur == nil {
		return nil
	}
	before := map[string]*controlplanev1.Account{}
	if prev != nil && sameReplica(prev, cur) {
		for _, a := range prev.accounts {
			before[a.GetKey()] = a
		}
	}
	rows := make([]topRow, 0, len(cur.accounts))
	for _, a := range cur.accounts {
		r := topRow{
			Key: a.GetKey(), Rate: a.GetRatePerMinute(), Effective: a.GetEffectiveRatePerMinute(), Adaptive: a.GetAdaptive(),
			Tokens: a.GetTokens(), ForbiddenTotal: a.GetForbiddenUpgrades(), Counted: a.GetCounted(),
			Quota:      tightest(cur.quotas[a.GetKey()]),
			Unreadable: a.GetUnreadable(),
		}
		if cur.quotaErr != nil {
			r.Quota = "?"
		}
		for _, ag := range cur.agents {
			if slices.Contains(ag.GetAccounts(), r.Key) {
				r.AgentsServing++
				if ag.GetLive() {
					r.LiveAgents++
				}
			}
		}
		if p, ok := before[r.Key]; ok && p.GetCounted() && a.GetCounted() && p.GetCountersSinceUnixMs() == a.GetCountersSinceUnixMs() {
			if mins := cur.at.Sub(prev.at).Minutes(); mins > 0 {
				per := func(now, then int64) *float64 {
					v := float64(max(now-then, 0)) / mins
					return &v
				}
				r.Admits = per(a.GetAdmits()+a.GetWaits(), p.GetAdmits()+p.GetWaits())
				r.Waits = per(a.GetWaits(), p.GetWaits())
				r.Refusals = per(a.GetRefusals(), p.GetRefusals())
				r.Forbidden = per(a.GetForbiddenUpgrades(), p.GetForbiddenUpgrades())
			}
		}
		rows = append(rows, r)
	}
	return rows
}

// sameReplica reports whether two samples came from one control-plane
// process, whose counters can be subtracted.
func sameReplica(a, b *topSample) bool {
	if a.store == nil || b.store == nil {
		return a.store == b.store
	}
	return a.store.Kind == b.store.Kind && a.store.Replica == b.store.Replica
}

// writeTop renders one frame.
func writeTop(w io.Writer, addr string, interval time.Duration, now time.Time, rows []topRow, cur *topSample, pollErr error) {
	live, total := 0, 0
	store := "-"
	if cur != nil {
		for _, ag := range cur.agents {
			total++
			if ag.GetLive() {
				live++
			}
		}
		if cur.store != nil {
			store = cur.store.String()
		}
	}
	fmt.Fprintf(w, "clodexctl top  %s  every %v  %s\n", addr, interval, now.UTC().Format("15:04:05 UTC"))
	fmt.Fprintf(w, "store: %s\n", store)
	fmt.Fprintf(w, "agents: %d live of %d registered; per-minute columns are over the last interval, counted by this replica\n", live, total)
	if pollErr != nil {
		fmt.Fprintf(w, "LAST POLL FAILED: %v (showing the previous poll)\n", pollErr)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ACCOUNT\tRATE/MIN\tEFFECTIVE\tTOKENS\tADMITS/MIN\tWAITS/MIN\tREFUSALS/MIN\t403/MIN\t403 TOTAL\tAGENTS\tQUOTA")
	debt := false
	for _, r := range rows {
		eff := strconv.Itoa(int(r.Effective))
		if r.Adaptive {
			eff += " (adaptive)"
		}
		total := strconv.FormatInt(r.ForbiddenTotal, 10)
		if !r.Counted {
			total = "n/c"
		}
		key := r.Key
		if r.Unreadable != "" {
			key += " UNREADABLE"
		}
		toks := tokens(r.Tokens)
		if r.Tokens < 0 && r.Effective > 0 {
			// Debt: sockets already admitted wait for these tokens; a new
			// one waits for a whole token at the effective rate.
			wait := time.Duration((1 - r.Tokens) / float64(r.Effective) * float64(time.Minute))
			toks += " (" + wait.Round(100*time.Millisecond).String() + " wait)"
			debt = true
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\n", key, r.Rate, eff, toks,
			perMin(r.Admits), perMin(r.Waits), perMin(r.Refusals), perMin(r.Forbidden), total, r.LiveAgents, r.AgentsServing, r.Quota)
	}
	_ = tw.Flush()
	for _, r := range rows {
		if r.Unreadable != "" {
			fmt.Fprintf(w, "unreadable: %s: %s\n", r.Key, r.Unreadable)
		}
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "no known accounts yet: an account appears with its first admission or stored policy")
		return
	}
	fmt.Fprintln(w, "\nADMITS/MIN: new upstream sockets admitted, at once or after a wait; WAITS/MIN: those of them that waited.")
	if debt {
		fmt.Fprintln(w, "TOKENS below 0: the bucket's debt, sockets admitted to open later, one per 1/EFFECTIVE minute; a new socket now waits the time shown.")
	}
	if cur != nil && cur.quotaErr != nil {
		fmt.Fprintf(w, "QUOTA ?: plan usage cannot be read now (%s); it shows again when the store answers.\n", status.Convert(cur.quotaErr).Message())
	}
}

func perMin(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64)
}
