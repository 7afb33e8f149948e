package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const setBudgetUsage = "set-budget ACCOUNT [--idle-timeout D] [--total-timeout D] [--max-retries N]"

var setBudgetCmd = &command{
	name:  "set-budget",
	usage: setBudgetUsage,
	short: "set the request budget; the wait bound is derived from it, and retries left unset are lowered to fit a shorter idle timeout",
	run:   runSetBudget,
}

type setBudgetArgs struct {
	target      target
	idle, total *time.Duration
	maxRetries  *int
}

func durationFlag(dst **time.Duration, allowed string) func(string) error {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("not a duration; want a duration like 90s or 2m, %s", allowed)
		}
		*dst = &d
		return nil
	}
}

func runSetBudget(ctx context.Context, e *env, args []string) error {
	var a setBudgetArgs
	fs := e.flagSet("set-budget")
	a.target.register(fs)
	fs.Func("idle-timeout", "no-data deadline `D` every attempt of a request shares, 10s..1h", durationFlag(&a.idle, "10s..1h"))
	fs.Func("total-timeout", "total deadline `D` of a request, 10s or more", durationFlag(&a.total, "10s or more"))
	fs.Func("max-retries", "retries `N` the client makes, 0..10; its backoff ladder must fit the idle timeout (unset: the current retries, lowered to the largest that fits)", func(s string) error {
		n, err := strconv.Atoi(s)
		if err != nil {
			return errors.New("not an integer; allowed 0..10")
		}
		a.maxRetries = &n
		return nil
	})
	pos, err := e.parse(fs, setBudgetUsage, args)
	if err != nil {
		return err
	}
	label, key, rest, err := a.target.resolve(pos)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return usagef("unexpected argument %q; usage: clodexctl %s", rest[0], setBudgetUsage)
	}
	if a.idle == nil && a.total == nil && a.maxRetries == nil {
		return usagef("nothing to set; give at least one of --idle-timeout (10s..1h), --total-timeout (10s or more), --max-retries (0..10)")
	}
	req := &controlplanev1.SetBudgetRequest{Key: key}
	var errs []error
	if a.idle != nil {
		if *a.idle < pacing.MinIdleTimeout || *a.idle > pacing.MaxIdleTimeout {
			errs = append(errs, fmt.Errorf("--idle-timeout %v is out of range; allowed 10s..1h", *a.idle))
		}
		req.IdleTimeoutMs = proto.Int64(a.idle.Milliseconds())
	}
	if a.total != nil {
		if *a.total < pacing.MinTotalTimeout {
			errs = append(errs, fmt.Errorf("--total-timeout %v is out of range; allowed 10s or more", *a.total))
		}
		req.TotalTimeoutMs = proto.Int64(a.total.Milliseconds())
	}
	if a.maxRetries != nil {
		if *a.maxRetries < 0 || *a.maxRetries > pacing.MaxMaxRetries {
			errs = append(errs, fmt.Errorf("--max-retries %d is out of range; allowed 0..10", *a.maxRetries))
		}
		req.MaxRetries = proto.Int32(int32(*a.maxRetries))
	}
	if len(errs) > 0 {
		return usagef("%v", joinLine(errs))
	}
	c, err := e.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	cctx, cancel := e.callCtx(ctx)
	defer cancel()
	resp, err := c.admin.SetBudget(cctx, req)
	if err != nil {
		return c.rpcError(err, label, key)
	}
	return e.printAccount(view(label, resp.GetAccount()))
}

// joinLine joins errors on one line.
func joinLine(errs []error) error {
	msg := ""
	for i, err := range errs {
		if i > 0 {
			msg += "; "
		}
		msg += err.Error()
	}
	return errors.New(msg)
}
