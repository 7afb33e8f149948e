package controlplane

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/clodex/clodex/controlplane/store"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// The fleet's quota view: every replica reads the plan usage the store
// holds (the latest report of each account and window, whichever data
// plane sent it) every QuotaRefresh, and at once when one of its own
// agents reports; it pushes each account's latest figures to the agents
// that serve it (QuotaPush), and keeps each window's reports of the last
// QuotaHistory for its burn rate (ListQuotas: burn_percent_per_minute,
// empties_in_seconds).
const (
	// QuotaHistory is how far back a window's burn rate looks.
	QuotaHistory = 15 * time.Minute
	// QuotaRefresh is how often a replica reads the store's plan usage.
	QuotaRefresh = 5 * time.Second
	// quotaSampleEvery spaces the samples kept: a report less than this
	// after the sample before the latest replaces the latest, so a
	// window keeps at most QuotaHistory/quotaSampleEvery + 2 samples.
	quotaSampleEvery = 10 * time.Second
	// maxQuotaViewAccounts bounds the accounts the view holds.
	maxQuotaViewAccounts = 10000
	// maxQuotaPushAccounts bounds the accounts of one QuotaPush.
	maxQuotaPushAccounts = 100
)

// quotaSample is one report of a window.
type quotaSample struct {
	at     time.Time // when the data plane read it
	used   float64
	resets time.Time
}

// quotaView is this replica's copy of the fleet's plan usage.
type quotaView struct {
	mu      sync.Mutex // guards the following fields
	latest  map[string]store.Quota
	samples map[string]map[string][]quotaSample // account -> window -> samples, oldest first
	read    time.Time                           // the last refresh from the store
}

func newQuotaView() *quotaView {
	return &quotaView{latest: map[string]store.Quota{}, samples: map[string]map[string][]quotaSample{}}
}

// observe records q, the store's latest for its account, at now; it
// reports whether q differs from the latest the view held.
func (v *quotaView) observe(q store.Quota, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	cur, ok := v.latest[q.Key]
	if !ok && len(v.latest) >= maxQuotaViewAccounts {
		return false
	}
	changed := !ok || !cur.ReportedAt.Equal(q.ReportedAt) || cur.LimitReached != q.LimitReached ||
		!slices.EqualFunc(cur.Windows, q.Windows, func(a, b store.QuotaWindow) bool {
			return a.Name == b.Name && a.UsedPercent == b.UsedPercent && a.ResetsAt.Equal(b.ResetsAt) && a.ReportedAt.Equal(b.ReportedAt)
		})
	v.latest[q.Key] = q
	for _, w := range q.Windows {
		v.sampleLocked(q.Key, w, now)
	}
	return changed
}

// sampleLocked adds a window's report to its samples and forgets the
// samples older than QuotaHistory at now.
func (v *quotaView) sampleLocked(key string, w store.QuotaWindow, now time.Time) {
	byWindow := v.samples[key]
	if byWindow == nil {
		byWindow = map[string][]quotaSample{}
		v.samples[key] = byWindow
	}
	s := byWindow[w.Name]
	n := len(s)
	if w.ReportedAt.IsZero() || n > 0 && !w.ReportedAt.After(s[n-1].at) {
		return // not newer than the latest sample
	}
	smp := quotaSample{at: w.ReportedAt, used: w.UsedPercent, resets: w.ResetsAt}
	if n >= 2 && smp.at.Sub(s[n-2].at) < quotaSampleEvery {
		s[n-1] = smp
	} else {
		s = append(s, smp)
	}
	cut := now.Add(-QuotaHistory)
	i := 0
	for i < len(s)-1 && s[i].at.Before(cut) {
		i++
	}
	byWindow[w.Name] = slices.Delete(s, 0, i)
}

// forecast is a window's burn rate over the samples of the last
// QuotaHistory at now that share the latest sample's reset, in percent
// per minute (burnOK false when they span less than a minute), and how
// long from now until it is used up at that rate (emptiesOK false when
// the rate is unknown or 0; 0 when it is used up).
func (v *quotaView) forecast(key, name string, now time.Time) (burn float64, burnOK bool, emptiesIn time.Duration, emptiesOK bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := v.samples[key][name]
	n := len(s)
	if n < 2 {
		return 0, false, 0, false
	}
	last := s[n-1]
	first := n - 1
	for first > 0 && !s[first-1].at.Before(now.Add(-QuotaHistory)) && sameReset(s[first-1].resets, last.resets) {
		first--
	}
	dt := last.at.Sub(s[first].at)
	if dt < time.Minute {
		return 0, false, 0, false
	}
	burn = max(0, (last.used-s[first].used)/dt.Minutes())
	switch {
	case last.used >= 100:
		return burn, true, 0, true
	case burn <= 0:
		return burn, true, 0, false
	}
	at := last.at.Add(time.Duration((100 - last.used) / burn * float64(time.Minute)))
	return burn, true, max(at.Sub(now), 0), true
}

// pushFor returns the latest figures of those of keys whose report time
// differs from sent's (which it updates), as QuotaPush messages of at
// most maxQuotaPushAccounts accounts.
func (v *quotaView) pushFor(keys []string, sent map[string]time.Time) []*controlplanev1.QuotaPush {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []*controlplanev1.QuotaPush
	var cur *controlplanev1.QuotaPush
	for _, k := range keys {
		q, ok := v.latest[k]
		if !ok || sent[k].Equal(q.ReportedAt) {
			continue
		}
		sent[k] = q.ReportedAt
		if cur == nil || len(cur.GetAccounts()) >= maxQuotaPushAccounts {
			cur = &controlplanev1.QuotaPush{}
			out = append(out, cur)
		}
		cur.Accounts = append(cur.Accounts, rateLimitsOf(q))
	}
	return out
}

// rateLimitsOf is q as a RateLimits message.
func rateLimitsOf(q store.Quota) *controlplanev1.RateLimits {
	rl := &controlplanev1.RateLimits{Account: q.Key, PlanType: q.PlanType, LimitReached: q.LimitReached, AtUnixMs: unixMs(q.ReportedAt)}
	for _, w := range q.Windows {
		rl.Windows = append(rl.Windows, &controlplanev1.QuotaWindow{Name: w.Name, UsedPercent: w.UsedPercent,
			WindowMinutes: int32(w.Window / time.Minute), ResetsAtUnixMs: unixMs(w.ResetsAt)})
	}
	return rl
}

// pushQuotas sends c the fleet's figures of its accounts that it has not
// been sent yet. Only the stream's sending goroutine calls it.
func (s *Server) pushQuotas(stream agentStream, c *agentConn) error {
	if c.quotaSent == nil {
		c.quotaSent = map[string]time.Time{}
	}
	for _, p := range s.quotaView.pushFor(s.agents.accountsOf(c), c.quotaSent) {
		if err := stream.Send(&controlplanev1.ConnectResponse{Msg: &controlplanev1.ConnectResponse_Quotas{Quotas: p}}); err != nil {
			return err
		}
	}
	return nil
}

// refreshQuotas reads the store's plan usage into the view when
// QuotaRefresh has passed since the last read, and wakes the agents
// serving the accounts whose figures changed (the fleet loop).
func (s *Server) refreshQuotas(ctx context.Context, now time.Time) {
	if s.opts.Quotas == nil {
		return
	}
	s.quotaView.mu.Lock()
	due := now.Sub(s.quotaView.read) >= QuotaRefresh || now.Before(s.quotaView.read)
	if due {
		s.quotaView.read = now
	}
	s.quotaView.mu.Unlock()
	if !due {
		return
	}
	qs, err := s.opts.Quotas.Quotas(ctx, "")
	if err != nil {
		s.log.DebugContext(ctx, "read the fleet's plan usage", "err", err)
		return
	}
	var changed []string
	for _, q := range qs {
		if s.quotaView.observe(q, now) {
			changed = append(changed, q.Key)
		}
	}
	s.agents.wakeServing(changed)
}

// wakeServing wakes the open agents of capability USAGE or later that
// serve any of keys (sorted), so their next flush pushes the new figures.
func (d *directory) wakeServing(keys []string) {
	if len(keys) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range d.agents {
		if c.closed != "" || c.capability < int(controlplanev1.CapabilityVersion_CAPABILITY_VERSION_USAGE) {
			continue
		}
		for _, k := range c.accounts {
			if _, ok := slices.BinarySearch(keys, k); ok {
				c.signal()
				break
			}
		}
	}
}
