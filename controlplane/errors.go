package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/console"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
)

// invalidError is a request the server rejects as InvalidArgument; its
// message names what was wrong and what is allowed.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// toStatus maps a domain error to a gRPC status. It is the one place that
// does; op names the RPC for unexpected errors, which are logged here once
// and reach the client only as Internal.
func (s *Server) toStatus(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	var inv *invalidError
	var rng *pacing.RangeError
	var wr *store.WriteError
	var bad *store.BadRecordError
	switch {
	case errors.As(err, &bad):
		// A record that does not decode: the operator must set it again
		// (or restore it); the message names it.
		return status.Errorf(codes.FailedPrecondition, "%s: %v", op, bad)
	case errors.As(err, &inv), errors.As(err, &rng):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, store.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.As(err, &wr):
		// The operator must fix the data dir; the client learns why.
		s.log.LogAttrs(ctx, slog.LevelError, "rpc failed: the store cannot write", slog.String("method", op), slog.String("err", err.Error()))
		return status.Errorf(codes.FailedPrecondition, "%s: policy not saved: %v", op, wr)
	case errors.Is(err, console.ErrNoConsole):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, console.ErrTooManyLinks):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, store.ErrUnavailable):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	s.log.LogAttrs(ctx, slog.LevelError, "rpc failed", slog.String("method", op), slog.String("err", err.Error()))
	return status.Errorf(codes.Internal, "%s: internal error", op)
}

// storeStatus maps the failure of a call into a store (the scoped agent
// credentials, the broker's sign-ins): the errors toStatus knows as it
// maps them, and the caller's own deadline as DeadlineExceeded; any other
// is the store failing (Redis unreachable or its breaker open, its call
// deadline passed, a record it cannot read), which is Unavailable
// with its cause and what to do, never Internal.
func (s *Server) storeStatus(ctx context.Context, op string, err error) error {
	var inv *invalidError
	var rng *pacing.RangeError
	var wr *store.WriteError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &inv), errors.As(err, &rng), errors.As(err, &wr),
		errors.Is(err, store.ErrNotFound), errors.Is(err, store.ErrUnavailable):
		return s.toStatus(ctx, op, err)
	case ctx.Err() != nil:
		// The caller's deadline or cancellation, not the store's own
		// deadline (which ends a call while the caller still waits).
		return s.toStatus(ctx, op, ctx.Err())
	}
	s.log.LogAttrs(ctx, slog.LevelWarn, "rpc failed: the store did not answer", slog.String("method", op), slog.String("err", err.Error()))
	return status.Errorf(codes.Unavailable,
		"%s: the store did not answer (%v); nothing may have been saved: run the command again once it answers (clodexctl health --store says when)", op, err)
}
