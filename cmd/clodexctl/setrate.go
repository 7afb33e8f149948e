package main

import (
	"context"
	"errors"
	"strconv"

	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const setRateUsage = "set-rate ACCOUNT RATE [--burst N] | set-rate --key KEY RATE"

var setRateCmd = &command{
	name:  "set-rate",
	usage: setRateUsage,
	short: "set new connections per minute (0..600, 0 = off) and burst (1..1000)",
	run:   runSetRate,
}

type setRateArgs struct {
	target target
	burst  int
	hasBur bool
}

func runSetRate(ctx context.Context, e *env, args []string) error {
	var a setRateArgs
	fs := e.flagSet("set-rate")
	a.target.register(fs)
	fs.Func("burst", "burst `N`, 1..1000 (default: keep the current burst)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil {
			return errors.New("not an integer; allowed 1..1000")
		}
		if err := pacing.ValidateBurst(n); err != nil {
			return errors.New("out of range; allowed 1..1000")
		}
		a.burst, a.hasBur = n, true
		return nil
	})
	pos, err := e.parse(fs, setRateUsage, args)
	if err != nil {
		return err
	}
	label, key, rest, err := a.target.resolve(pos)
	if err != nil {
		return err
	}
	if len(rest) == 0 {
		return usagef("missing RATE; usage: clodexctl %s (RATE is new connections per minute, 0..600; 0 turns pacing off)", setRateUsage)
	}
	if len(rest) > 1 {
		return usagef("unexpected argument %q; usage: clodexctl %s", rest[1], setRateUsage)
	}
	rate, err := strconv.Atoi(rest[0])
	if err != nil {
		return usagef("RATE %q is not an integer; allowed 0..600 new connections per minute (0 turns pacing off)", rest[0])
	}
	if err := pacing.ValidateRate(rate); err != nil {
		return usagef("%v (new connections per minute; 0 turns pacing off)", err)
	}
	req := &controlplanev1.SetRateRequest{Key: key, RatePerMinute: int32(rate)} //nolint:gosec // G109: pacing.ValidateRate bounded rate to 0..600 above
	if a.hasBur {
		req.Burst = proto.Int32(int32(a.burst))
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	resp, err := c.admin.SetRate(cctx, req)
	if err != nil {
		return c.rpcError(err, label, key)
	}
	return e.printAccount(view(label, resp.GetAccount()))
}
