package control

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Limits of one ReportGrants request, as the control plane enforces them.
const (
	maxReportAccounts = 200
	maxReportGrants   = 100000
	maxReportIDPrefix = 100 // the agent id part of a report id (ids are at most 128 bytes)
)

// recoverTimeout bounds one hand-over of the hand-over loop: a few
// ReportGrants RPCs, each under Config.Timeout.
const recoverTimeout = 5 * time.Second

// grantTally is one account's local grants not yet in a report.
type grantTally struct {
	count       int64
	first, last time.Time
}

// pendingReport is a hand-over sent (or about to be) but not confirmed. A
// retry sends it again with the same id, so the control plane debits it
// once however often it is sent.
type pendingReport struct {
	id     string
	grants []*controlplanev1.LocalGrants
}

// reportPrefix is the report id's prefix: the agent id, cut to leave room
// for the sequence number.
func reportPrefix(agentID string) string {
	if len(agentID) > maxReportIDPrefix {
		return agentID[:maxReportIDPrefix]
	}
	return agentID
}

// tallyLocked counts one local grant for key at now.
func (c *Client) tallyLocked(key string, now time.Time) {
	t := c.tally[key]
	if t == nil {
		t = &grantTally{first: now}
		c.tally[key] = t
	}
	t.count++
	t.last = now
}

// untallyLocked takes back one grant of key whose reservation was
// refunded, if it is not in a report already.
func (c *Client) untallyLocked(key string) {
	if t := c.tally[key]; t != nil {
		if t.count--; t.count <= 0 {
			delete(c.tally, key)
		}
	}
}

// queueReportsLocked moves the tally into pending reports of at most
// maxReportAccounts accounts each.
func (c *Client) queueReportsLocked() {
	if len(c.tally) == 0 {
		return
	}
	keys := make([]string, 0, len(c.tally))
	for k := range c.tally {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for chunk := range slices.Chunk(keys, maxReportAccounts) {
		c.reportSeq++
		r := &pendingReport{id: c.reportPrefix + "-g" + strconv.FormatUint(c.reportSeq, 10)}
		for _, k := range chunk {
			t := c.tally[k]
			r.grants = append(r.grants, &controlplanev1.LocalGrants{
				Account:     k,
				Count:       int32(min(t.count, maxReportGrants)),
				FirstUnixMs: t.first.UnixMilli(),
				LastUnixMs:  t.last.UnixMilli(),
			})
		}
		c.pending = append(c.pending, r)
	}
	clear(c.tally)
}

// handOver reports the grants this client made locally to the control
// plane (ReportGrants), one report at a time, each under Config.Timeout.
// It returns nil when nothing is left to report. An unreachable control
// plane ends it with the error and keeps the unconfirmed report for the
// next attempt, under the same id; a control plane that refuses a report
// otherwise (Unimplemented: it predates the hand-over; InvalidArgument,
// PermissionDenied, ...) gets it dropped, with a log and a one-time
// notice, since sending it again would fail the same way. Only one
// hand-over runs at a time; a second caller returns nil at once.
func (c *Client) handOver(ctx context.Context) error {
	c.mu.Lock()
	if c.reporting {
		c.mu.Unlock()
		return nil
	}
	c.reporting = true
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.reporting = false
		c.mu.Unlock()
	}()
	// Grants made while a report is in flight get a report of their own,
	// made once the reports before it are confirmed (so a long outage's
	// failed probes leave one report to resend, not one each); the bound
	// only keeps a client admitting locally at a high rate from holding
	// the prober here forever.
	for range 8 {
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.queueReportsLocked()
		}
		if len(c.pending) == 0 {
			c.mu.Unlock()
			return nil
		}
		r := c.pending[0]
		c.mu.Unlock()

		resp, err := c.report(ctx, r)
		if err != nil && unreachable(err) {
			return err
		}
		if e, ok := c.refuse(ctx, err); ok {
			return e // kept for when the control plane accepts this data plane again
		}
		c.mu.Lock()
		c.pending = slices.DeleteFunc(c.pending, func(p *pendingReport) bool { return p == r })
		if err == nil {
			c.stats.HandOvers++
			for _, d := range resp.GetDebits() {
				c.stats.HandedOver += int64(d.GetDebited())
			}
		}
		c.mu.Unlock()
		if err != nil {
			c.droppedReport(ctx, r, err)
		}
	}
	return nil
}

// report sends one report under Config.Timeout and logs what the control
// plane debited.
func (c *Client) report(ctx context.Context, r *pendingReport) (*controlplanev1.ReportGrantsResponse, error) {
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.stores.admission.ReportGrants(rctx, &controlplanev1.ReportGrantsRequest{
		ReportId: r.id,
		AgentId:  c.id,
		Grants:   r.grants,
	})
	if err != nil {
		return nil, err
	}
	var reported, debited int64
	dup := false
	for _, g := range r.grants {
		reported += int64(g.GetCount())
	}
	for _, d := range resp.GetDebits() {
		debited += int64(d.GetDebited())
		dup = dup || d.GetDuplicate()
	}
	c.log.LogAttrs(ctx, slog.LevelInfo, "handed local grants over to the control plane",
		slog.String("report_id", r.id), slog.Int("accounts", len(r.grants)),
		slog.Int64("grants", reported), slog.Int64("debited", debited), slog.Bool("duplicate", dup))
	return resp, nil
}

// droppedReport logs a report the control plane refused, and announces
// it once per code.
func (c *Client) droppedReport(ctx context.Context, r *pendingReport, err error) {
	code := status.Code(err)
	var grants int64
	for _, g := range r.grants {
		grants += int64(g.GetCount())
	}
	c.log.LogAttrs(ctx, slog.LevelWarn, "control plane refused the hand-over of local grants; dropping it",
		slog.String("report_id", r.id), slog.Int64("grants", grants), slog.String("code", code.String()),
		slog.String("err", status.Convert(err).Message()))
	msg := fmt.Sprintf("the control plane refused the hand-over of the new upstream connections admitted locally during its outage (%v): "+
		"it does not count them, so the fleet may open more than the account's rate right after an outage", code)
	if code == codes.Unimplemented {
		msg = "the control plane predates the hand-over of locally admitted connections (capability version 3): " +
			"it does not count the new upstream connections admitted locally during its outage"
	}
	c.notices.Emit(pacing.Notice{Key: "admission.handover:" + code.String(), Message: msg}, c.notify)
}

// recover hands admission back to the control plane now: a local client
// reports the grants it made during the outage (ReportGrants) and, once
// the control plane has confirmed them, decides centrally again
// (announced once). The hand-over loop runs it when the control plane
// shows a sign of life (the agent stream has connected, the broker
// answered): the grants should reach it before the rest of the fleet,
// back at the full rate, opens more. A central or closed client, or one
// whose probe is already running, returns nil at once. When the report
// fails the client stays local, keeps the grants for the next probe and
// returns the error.
func (c *Client) recover(ctx context.Context) error {
	c.mu.Lock()
	if c.closed || !c.reach.local || c.reach.probing {
		c.mu.Unlock()
		return nil
	}
	c.reach.probing = true
	c.stats.Probes++
	c.mu.Unlock()

	err := c.handOver(ctx)
	now := c.now()
	c.mu.Lock()
	c.reach.probing = false
	back := false
	if err != nil {
		c.reach.schedule(now, c.rand())
	} else {
		back = c.backLocked()
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("recover central admission: %w", err)
	}
	if back {
		c.announceBack(ctx)
	}
	return nil
}

// handOverLoop runs recover each time the control plane answers while
// admission is local (alive), until ctx ends. It is owned by Run.
func (c *Client) handOverLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.answered:
		}
		rctx, cancel := context.WithTimeout(ctx, recoverTimeout)
		if err := c.recover(rctx); err != nil {
			c.log.WarnContext(ctx, "control plane reconnected, but the hand-over failed; the next new connection probes again", "err", err)
		}
		cancel()
	}
}
