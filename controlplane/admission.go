package controlplane

import (
	"context"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/pacing"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Admitter runs admissions. *store.Memory and *redisstore.Store
// implement it.
type Admitter interface {
	Admit(ctx context.Context, key string, now time.Time) (store.Admission, error)
	Cancel(ctx context.Context, key string, reservation uint64, now time.Time) (bool, error)
	// HandOver debits grants a data plane made locally during an outage
	// (store.HandOverResult); store.ErrUnavailable when it cannot be
	// recorded now.
	HandOver(ctx context.Context, key string, grants int, reportID string, now time.Time) (store.HandOverResult, error)
}

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
	if err := s.checkScope(ctx, "Admit", key); err != nil {
		return nil, err
	}
	member := req.GetMember()
	if member != "" {
		if err := store.ValidateMemberName(member); err != nil {
			return nil, s.toStatus(ctx, "Admit", invalidf("member: %v", err))
		}
	}
	if err := s.checkServed(ctx, controlplanev1.AdmissionService_Admit_FullMethodName, key, req.GetAgentId()); err != nil {
		return nil, err
	}
	now := s.now()
	md, capped, err := s.memberCap(ctx, member, now)
	if err != nil {
		return nil, s.toStatus(ctx, "Admit", err)
	}
	if capped && md.Kind == pacing.KindRefuse {
		// The member's cap is spent: the account's bucket is not asked.
		s.metrics.memberRefusals.Inc()
		return &controlplanev1.AdmitResponse{Decision: controlplanev1.Decision_DECISION_REFUSE, MemberLimited: true,
			RetryAfterMs: md.RetryAfter.Milliseconds(), RequiredWaitMs: md.RequiredWait.Milliseconds()}, nil
	}
	adm, err := s.opts.Admissions.Admit(ctx, key, now)
	if err != nil {
		s.refundMember(ctx, member, md, capped, now)
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
	switch {
	case !capped:
	case d.Kind == pacing.KindRefuse:
		s.refundMember(ctx, member, md, capped, now)
	case md.Kind == pacing.KindWait && md.Wait > d.Wait:
		// Admitted by both, the member's slot later than the account's.
		d.Kind, d.Wait, d.RequiredWait = pacing.KindWait, md.Wait, max(d.RequiredWait, md.RequiredWait)
		resp.MemberLimited = true
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
	if err := s.checkScope(ctx, "Cancel", key); err != nil {
		return nil, err
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

// maxGrantsPerReport bounds the accounts of one ReportGrants, so that
// its largest message (128-byte keys) fits the method's receive limit,
// MaxRecvMsgSize.
const maxGrantsPerReport = 200

// validReportID checks a hand-over report id.
func validReportID(id string) error {
	if id == "" || len(id) > 128 {
		return invalidf("report_id is %d bytes; want 1..128 printable ASCII bytes without spaces", len(id))
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c > '~' {
			return invalidf("report_id has a byte 0x%02x at %d; allowed printable ASCII without spaces", c, i)
		}
	}
	return nil
}

// ReportGrants applies a data plane's hand-over: each account's local
// grants are debited as if admitted now (store.HandOverResult).
func (a *admissionService) ReportGrants(ctx context.Context, req *controlplanev1.ReportGrantsRequest) (*controlplanev1.ReportGrantsResponse, error) {
	s := a.s
	if err := validReportID(req.GetReportId()); err != nil {
		return nil, s.toStatus(ctx, "ReportGrants", err)
	}
	grants := req.GetGrants()
	if len(grants) == 0 || len(grants) > maxGrantsPerReport {
		return nil, s.toStatus(ctx, "ReportGrants", invalidf("grants lists %d accounts; allowed 1..%d", len(grants), maxGrantsPerReport))
	}
	seen := make(map[string]bool, len(grants))
	for i, g := range grants {
		if err := store.ValidateKey(g.GetAccount()); err != nil {
			return nil, s.toStatus(ctx, "ReportGrants", invalidf("grants[%d].account: %v", i, err))
		}
		if seen[g.GetAccount()] {
			return nil, s.toStatus(ctx, "ReportGrants", invalidf("grants[%d].account %s is listed twice; report each account once", i, g.GetAccount()))
		}
		seen[g.GetAccount()] = true
		if err := s.checkScope(ctx, "ReportGrants", g.GetAccount()); err != nil {
			return nil, err
		}
		if n := g.GetCount(); n < 1 || n > store.MaxHandOverGrants {
			return nil, s.toStatus(ctx, "ReportGrants", invalidf("grants[%d].count %d is out of range; allowed 1..%d", i, n, store.MaxHandOverGrants))
		}
	}
	resp := &controlplanev1.ReportGrantsResponse{Debits: make([]*controlplanev1.GrantDebit, 0, len(grants))}
	total := 0
	for _, g := range grants {
		// An account nobody configured or serves gets no bucket: nothing
		// is debited for it.
		if err := s.checkServed(ctx, controlplanev1.AdmissionService_ReportGrants_FullMethodName, g.GetAccount(), req.GetAgentId()); err != nil {
			if status.Code(err) != codes.PermissionDenied {
				return nil, err
			}
			resp.Debits = append(resp.Debits, &controlplanev1.GrantDebit{Account: g.GetAccount()})
			continue
		}
		r, err := s.opts.Admissions.HandOver(ctx, g.GetAccount(), int(g.GetCount()), req.GetReportId(), s.now())
		if err != nil {
			return nil, s.toStatus(ctx, "ReportGrants", err)
		}
		total += r.Debited
		s.metrics.handover.Add(float64(r.Debited))
		resp.Debits = append(resp.Debits, &controlplanev1.GrantDebit{
			Account:   g.GetAccount(),
			Debited:   int32(r.Debited),
			Duplicate: r.Duplicate,
			Tokens:    r.Account.Tokens,
		})
	}
	s.log.InfoContext(ctx, "grants handed over", "agent_id", req.GetAgentId(), "report_id", req.GetReportId(),
		"accounts", len(grants), "debited", total)
	return resp, nil
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

// refundMember gives the member's token back when the account did not
// admit what it was taken for. A failure costs the member one token until
// its bucket refills: it is logged, not answered.
func (s *Server) refundMember(ctx context.Context, member string, md pacing.Decision, capped bool, now time.Time) {
	if !capped || !md.Debited {
		return
	}
	if err := s.opts.MemberBuckets.RefundMember(ctx, member, md.ID, now); err != nil {
		s.log.WarnContext(ctx, "refund a member's token", "member", member, "err", err)
	}
}
