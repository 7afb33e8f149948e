package controlplane

import (
	"context"
	"strconv"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

type admissionService struct {
	controlplanev1.UnimplementedAdmissionServiceServer
	s *Server
}

func (a *admissionService) Admit(ctx context.Context, req *controlplanev1.AdmitRequest) (*controlplanev1.AdmitResponse, error) {
	s := a.s
	key := req.GetAccount()
	if err := store.ValidateKey(key); err != nil {
		return nil, s.toStatus(ctx, "Admit", &invalidError{msg: "account: " + err.Error()})
	}
	adm, err := s.opts.Admissions.Admit(ctx, key, s.now())
	if err != nil {
		return nil, s.toStatus(ctx, "Admit", err)
	}
	s.metrics.observe(key, adm.Decision)
	d := adm.Decision
	if d.Relaxed {
		s.noteRelaxed(ctx, key)
	}
	resp := &controlplanev1.AdmitResponse{
		PolicyVersion: adm.PolicyVersion,
		Debited:       d.Debited,
		Relaxed:       d.Relaxed,
	}
	switch d.Kind {
	case pacing.KindAdmit:
		resp.Decision = controlplanev1.Decision_DECISION_ADMIT
	case pacing.KindWait:
		resp.Decision = controlplanev1.Decision_DECISION_WAIT
		resp.WaitMs = d.Wait.Milliseconds()
		resp.RequiredWaitMs = d.RequiredWait.Milliseconds()
	case pacing.KindRefuse:
		resp.Decision = controlplanev1.Decision_DECISION_REFUSE
		resp.RetryAfterMs = d.RetryAfter.Milliseconds()
		resp.RequiredWaitMs = d.RequiredWait.Milliseconds()
	}
	if adm.Reservation != 0 {
		resp.ReservationId = strconv.FormatUint(adm.Reservation, 10)
	}
	return resp, nil
}

func (a *admissionService) Cancel(ctx context.Context, req *controlplanev1.CancelRequest) (*controlplanev1.CancelResponse, error) {
	s := a.s
	key := req.GetAccount()
	if err := store.ValidateKey(key); err != nil {
		return nil, s.toStatus(ctx, "Cancel", &invalidError{msg: "account: " + err.Error()})
	}
	id, err := strconv.ParseUint(req.GetReservationId(), 10, 64)
	if err != nil || id == 0 {
		return nil, s.toStatus(ctx, "Cancel", invalidf("reservation_id %q is invalid; want the non-empty reservation_id of an AdmitResponse", req.GetReservationId()))
	}
	ok, err := s.opts.Admissions.Cancel(ctx, key, id, s.now())
	if err != nil {
		return nil, s.toStatus(ctx, "Cancel", err)
	}
	s.metrics.cancelled(ok)
	return &controlplanev1.CancelResponse{Refunded: ok}, nil
}

type benchService struct {
	controlplanev1.UnimplementedBenchServiceServer
}

// Noop answers a response the size of a typical AdmitResponse.
func (benchService) Noop(context.Context, *controlplanev1.NoopRequest) (*controlplanev1.NoopResponse, error) {
	return &controlplanev1.NoopResponse{
		Decision: controlplanev1.Decision_DECISION_ADMIT,
		Debited:  true,
	}, nil
}

// noteRelaxed logs, once per account, that admissions go past the ceiling
// because the account's policy cannot refuse.
func (s *Server) noteRelaxed(ctx context.Context, key string) {
	acct, err := s.opts.Policies.Account(ctx, key, s.now())
	if err != nil {
		return
	}
	n := acct.Policy.RelaxedNotice()
	n.Key += ":" + key
	s.notices.Emit(n, func(msg string) { s.log.WarnContext(ctx, msg, "account", key, "notice", pacing.KeyCeilingRelaxed) })
}
