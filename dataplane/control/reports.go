package control

import (
	"maps"
	"math"
	"slices"
	"time"

	"github.com/clodex/clodex/internal/account"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// report is the queued 403s of one account.
type report struct {
	first      time.Time
	count      int
	retryAfter time.Duration // the longest retry-after among them
}

// Report403 queues one upstream 403 for accountKey with its retry-after
// (0: none) for the agent stream; it never blocks. Reports for one account
// queued together (or while disconnected) are coalesced into one with a
// count and the longest retry-after. A key that is not an account key is
// dropped with a warning.
func (c *Client) Report403(accountKey string, retryAfter time.Duration) {
	if !account.IsKey(accountKey) {
		c.log.Warn("dropping a 403 report for an invalid account key; want acct_ followed by 16 lowercase hex digits")
		return
	}
	now := c.now()
	c.streamMu.Lock()
	r := c.reports[accountKey]
	if r.count == 0 {
		r.first = now
	}
	r.count++
	r.retryAfter = max(r.retryAfter, retryAfter)
	c.reports[accountKey] = r
	c.streamMu.Unlock()
	c.kickReports()
}

// ReportRateLimits queues the latest plan usage read for the account
// (rl.Account) for the agent stream; it never blocks. A report not yet
// sent is replaced by a newer one for the same account. An invalid
// account key is dropped with a warning.
func (c *Client) ReportRateLimits(rl *controlplanev1.RateLimits) {
	if !account.IsKey(rl.GetAccount()) {
		c.log.Warn("dropping a rate-limits report for an invalid account key; want acct_ followed by 16 lowercase hex digits")
		return
	}
	c.streamMu.Lock()
	c.limits[rl.GetAccount()] = rl
	c.streamMu.Unlock()
	c.kickReports()
}

func (c *Client) kickReports() {
	select {
	case c.reported <- struct{}{}:
	default:
	}
}

// sendReports sends every queued 403 report, then the queued rate limits.
func (c *Client) sendReports(stream agentStream) error {
	if err := c.send403s(stream); err != nil {
		return err
	}
	return c.sendLimits(stream)
}

// sendLimits sends the queued rate limits; an unsent one goes back to the
// queue unless a newer one replaced it.
func (c *Client) sendLimits(stream agentStream) error {
	c.streamMu.Lock()
	queued := c.limits
	if len(queued) == 0 {
		c.streamMu.Unlock()
		return nil
	}
	c.limits = map[string]*controlplanev1.RateLimits{}
	c.streamMu.Unlock()
	keys := slices.Sorted(maps.Keys(queued))
	for i, k := range keys {
		if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_RateLimits{RateLimits: queued[k]}}); err != nil {
			c.streamMu.Lock()
			for _, k := range keys[i:] {
				if _, newer := c.limits[k]; !newer {
					c.limits[k] = queued[k]
				}
			}
			c.streamMu.Unlock()
			return err
		}
	}
	return nil
}

// send403s sends every queued 403 report.
func (c *Client) send403s(stream agentStream) error {
	c.streamMu.Lock()
	queued := c.reports
	if len(queued) == 0 {
		c.streamMu.Unlock()
		return nil
	}
	c.reports = map[string]report{}
	c.streamMu.Unlock()
	keys := slices.Sorted(maps.Keys(queued))
	for i, k := range keys {
		r := queued[k]
		msg := &controlplanev1.Upstream403{Account: k, AtUnixMs: r.first.UnixMilli(), Count: int32(min(r.count, math.MaxInt32)),
			RetryAfterMs: r.retryAfter.Milliseconds()}
		if err := stream.Send(&controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Upstream_403{Upstream_403: msg}}); err != nil {
			c.requeue(keys[i:], queued)
			return err
		}
	}
	return nil
}

// requeue puts unsent reports back, merged with any queued since.
func (c *Client) requeue(keys []string, queued map[string]report) {
	c.streamMu.Lock()
	defer c.streamMu.Unlock()
	for _, k := range keys {
		r, cur := queued[k], c.reports[k]
		if cur.count > 0 && cur.first.Before(r.first) {
			r.first = cur.first
		}
		r.count += cur.count
		r.retryAfter = max(r.retryAfter, cur.retryAfter)
		c.reports[k] = r
	}
}
