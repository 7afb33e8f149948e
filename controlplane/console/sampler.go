package console

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// What the sampler keeps: every SampleEvery a snapshot of the fleet read
// through the admin API; per account the samples of the last
// recentWindow (for per-minute rates) and one
// history point every historyStep for historyLen (24 h). History is kept
// for at most maxTracked accounts (the first by key), so the memory of a
// huge fleet stays bounded.
const (
	recentWindow = 15 * time.Minute
	historyStep  = 5 * time.Minute
	historyLen   = 288 // 24 h of 5-minute points
	maxTracked   = 500
	pageSize     = 500
)

// snapshot is the fleet as the admin API answered at one time.
type snapshot struct {
	at       time.Time
	store    *controlplanev1.StoreInfo
	accounts []*controlplanev1.Account
	quotas   map[string]*controlplanev1.AccountQuota
	agents   []*controlplanev1.Agent
	creds    []*controlplanev1.AgentCredential
	credsErr error  // the credential list's error (FailedPrecondition without scoped credentials)
	people   people // the members and the last 24 hours' usage (people.go)
	err      error  // why the last sampling failed, shown on the page
}

// sample is one account's counters and quota use at one time.
type sample struct {
	at                                 time.Time
	admits, waits, refusals, forbidden int64
	counted                            bool
	used                               map[string]float64 // quota window name -> used percent
}

// point is one account's state in the 24-hour history.
type point struct {
	At              time.Time
	Tokens          float64
	Rate, Effective int32
	RefusalsPerMin  float64
	ForbiddenPerMin float64
	Used            map[string]float64
}

type series struct {
	recent  []sample
	history []point
}

// sampler reads the fleet through the admin API. Run owns its loop.
type sampler struct {
	admin Admin
	now   func() time.Time

	kick chan struct{} // size 1: a pending request to sample now

	mu     sync.Mutex // guards the fields below
	last   snapshot
	series map[string]*series
	hours  hourly // each account's usage per hour, the last 24 hours (people.go)
}

func newSampler(admin Admin, now func() time.Time) *sampler {
	return &sampler{admin: admin, now: now, kick: make(chan struct{}, 1), series: map[string]*series{}, hours: hourly{}}
}

// run samples every every until ctx ends, and at once when kicked.
func (s *sampler) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}

// refresh asks the loop for a sample now (after an action).
func (s *sampler) refresh() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *sampler) snapshot() snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

func (s *sampler) sampleOnce(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	snap := snapshot{at: s.now(), quotas: map[string]*controlplanev1.AccountQuota{}}
	snap.err = s.read(ctx, &snap)
	s.mu.Lock()
	defer s.mu.Unlock()
	if snap.err != nil && s.last.accounts != nil {
		// Keep showing the last good answer, saying it is old.
		prev := s.last
		prev.err = snap.err
		s.last = prev
		return
	}
	s.last = snap
	for i, a := range snap.accounts {
		if i >= maxTracked {
			break
		}
		s.recordLocked(snap.at, a, snap.quotas[a.GetKey()])
	}
}

func (s *sampler) read(ctx context.Context, snap *snapshot) error {
	token := ""
	for {
		resp, err := s.admin.ListAccounts(ctx, &controlplanev1.ListAccountsRequest{PageSize: pageSize, PageToken: token})
		if err != nil {
			return fmt.Errorf("list accounts: %w", err)
		}
		snap.accounts = append(snap.accounts, resp.GetAccounts()...)
		snap.store = resp.GetStore()
		if token = resp.GetNextPageToken(); token == "" || len(snap.accounts) >= 10*pageSize {
			break
		}
	}
	if q, err := s.admin.ListQuotas(ctx, &controlplanev1.ListQuotasRequest{}); err == nil {
		for _, aq := range q.GetQuotas() {
			snap.quotas[aq.GetKey()] = aq
		}
	}
	token = ""
	for {
		resp, err := s.admin.ListAgents(ctx, &controlplanev1.ListAgentsRequest{PageSize: 100, PageToken: token})
		if err != nil {
			return fmt.Errorf("list agents: %w", err)
		}
		snap.agents = append(snap.agents, resp.GetAgents()...)
		if token = resp.GetNextPageToken(); token == "" || len(snap.agents) >= 1000 {
			break
		}
	}
	token = ""
	for {
		resp, err := s.admin.ListAgentCredentials(ctx, &controlplanev1.ListAgentCredentialsRequest{PageSize: 100, PageToken: token})
		if err != nil {
			snap.credsErr = err
			break
		}
		snap.creds = append(snap.creds, resp.GetCredentials()...)
		if token = resp.GetNextPageToken(); token == "" || len(snap.creds) >= 1000 {
			break
		}
	}
	snap.people = s.readPeople(ctx, snap.at)
	return nil
}

func (s *sampler) recordLocked(now time.Time, a *controlplanev1.Account, q *controlplanev1.AccountQuota) {
	sr := s.series[a.GetKey()]
	if sr == nil {
		if len(s.series) >= maxTracked {
			return
		}
		sr = &series{}
		s.series[a.GetKey()] = sr
	}
	smp := sample{at: now, admits: a.GetAdmits(), waits: a.GetWaits(), refusals: a.GetRefusals(),
		forbidden: a.GetForbiddenUpgrades(), counted: a.GetCounted(), used: map[string]float64{}}
	for _, w := range q.GetWindows() {
		smp.used[w.GetName()] = w.GetUsedPercent()
	}
	sr.recent = append(sr.recent, smp)
	cut := 0
	for cut < len(sr.recent)-1 && now.Sub(sr.recent[cut].at) > recentWindow {
		cut++
	}
	sr.recent = slices.Delete(sr.recent, 0, cut)
	if n := len(sr.history); n == 0 || now.Sub(sr.history[n-1].At) >= historyStep {
		rf, fb := sr.perMinute()
		sr.history = append(sr.history, point{At: now, Tokens: a.GetTokens(), Rate: a.GetRatePerMinute(),
			Effective: a.GetEffectiveRatePerMinute(), RefusalsPerMin: rf, ForbiddenPerMin: fb, Used: smp.used})
		if len(sr.history) > historyLen {
			sr.history = slices.Delete(sr.history, 0, len(sr.history)-historyLen)
		}
	}
}

// perMinute returns the refusals and 403s per minute over the last
// minute of samples (or what there is of it).
func (sr *series) perMinute() (refusals, forbidden float64) {
	n := len(sr.recent)
	if n < 2 {
		return 0, 0
	}
	last := sr.recent[n-1]
	first := sr.recent[0]
	for i := n - 2; i >= 0; i-- {
		first = sr.recent[i]
		if last.at.Sub(first.at) >= time.Minute {
			break
		}
	}
	dt := last.at.Sub(first.at).Minutes()
	if dt <= 0 || last.refusals < first.refusals || last.forbidden < first.forbidden {
		return 0, 0 // a replica restart reset the counters
	}
	return float64(last.refusals-first.refusals) / dt, float64(last.forbidden-first.forbidden) / dt
}

// seriesOf returns a copy of an account's series (nil when not tracked).
func (s *sampler) seriesOf(key string) *series {
	s.mu.Lock()
	defer s.mu.Unlock()
	sr := s.series[key]
	if sr == nil {
		return nil
	}
	return &series{recent: slices.Clone(sr.recent), history: slices.Clone(sr.history)}
}
