package pool

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/clodex/clodex/dataplane/retry"
	"github.com/clodex/clodex/dataplane/upstream"
)

// dialUpstream opens one socket for part: its account's current
// credential, the failure memory's ticket around the dial, and the hooks
// of Config (frames watched, a 403 reported).
func (p *Pool) dialUpstream(ctx context.Context, part Partition) (*upstream.Conn, error) {
	cred, err := p.cfg.Credentials.Credential(ctx, part.Account)
	if err != nil {
		return nil, fmt.Errorf("dial upstream: get credential: %w", err)
	}
	var ticket *retry.DialTicket // nil-safe: a nil Health gates nothing
	if p.cfg.Health != nil {
		if ticket, err = p.cfg.Health.Dial(p.upstream); err != nil {
			return nil, err
		}
		defer ticket.Done()
	}
	opts := p.cfg.Upstream
	opts.Credential = cred
	opts.OnFrame = nil
	if onFrame, account := p.cfg.OnFrame, part.Account; onFrame != nil && account != "" {
		opts.OnFrame = func(frame []byte) { onFrame(account, frame) }
	}
	c, err := upstream.Dial(ctx, opts)
	if err == nil {
		ticket.Reached()
		return c, nil
	}
	var unreach *upstream.UnreachableError
	var ue *upstream.UpgradeError
	refused := errors.As(err, &ue)
	switch {
	case ctx.Err() != nil:
	case errors.As(err, &unreach):
		ticket.Unreachable(err)
	case refused:
		ticket.Reached() // the backend answered: up
	}
	if refused && ue.Status == http.StatusForbidden && p.cfg.OnForbidden != nil && part.Account != "" {
		p.cfg.OnForbidden(part.Account, ue.RetryAfter)
	}
	return nil, err
}
