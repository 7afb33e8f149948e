package controlplane_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/account"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// clock is a fake clock safe for concurrent use.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

var key = account.Key("chatgpt-account-1")

func mustToken(t *testing.T, s string) bearer.Token {
	t.Helper()
	tok, err := bearer.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestAuthMatrix(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	srv.Register(key)
	// An account to read.
	if _, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil)).Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil {
		t.Fatal(err)
	}

	calls := map[string]func(ctx context.Context, cc *grpc.ClientConn) error{
		"Admit": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := controlplanev1.NewAdmissionServiceClient(cc).Admit(ctx, &controlplanev1.AdmitRequest{Account: key})
			return err
		},
		"Cancel": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := controlplanev1.NewAdmissionServiceClient(cc).Cancel(ctx, &controlplanev1.CancelRequest{Account: key, ReservationId: "1"})
			return err
		},
		"GetAccount": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := controlplanev1.NewAdminServiceClient(cc).GetAccount(ctx, &controlplanev1.GetAccountRequest{Key: key})
			return err
		},
		"ListAccounts": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := controlplanev1.NewAdminServiceClient(cc).ListAccounts(ctx, &controlplanev1.ListAccountsRequest{})
			return err
		},
		"SetRate": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := controlplanev1.NewAdminServiceClient(cc).SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 60})
			return err
		},
		"SetBudget": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := controlplanev1.NewAdminServiceClient(cc).SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, MaxRetries: proto.Int32(5)})
			return err
		},
		"Health": func(ctx context.Context, cc *grpc.ClientConn) error {
			_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			return err
		},
		"Reflection": func(ctx context.Context, cc *grpc.ClientConn) error {
			stream, err := reflectionpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
			if err != nil {
				return err
			}
			// Send reports io.EOF when the server has already ended the
			// stream; the status then comes from Recv.
			if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
				return err
			}
			resp, err := stream.Recv()
			if err != nil {
				return err
			}
			var names []string
			for _, s := range resp.GetListServicesResponse().GetService() {
				names = append(names, s.GetName())
			}
			if !strings.Contains(strings.Join(names, ","), "clodex.controlplane.v1.AdmissionService") {
				return fmt.Errorf("reflection lists %v, want AdmissionService", names)
			}
			return stream.CloseSend()
		},
	}

	tokens := map[string]bearer.Token{
		"none":  {},
		"wrong": mustToken(t, "not-the-token"),
		"agent": srv.AgentToken,
		"admin": srv.AdminToken,
	}
	ok, unauth, denied := codes.OK, codes.Unauthenticated, codes.PermissionDenied
	tests := []struct {
		call  string
		want  map[string]codes.Code // by token
		admin bool
	}{
		{call: "Admit", want: map[string]codes.Code{"none": unauth, "wrong": unauth, "agent": ok, "admin": ok}},
		{call: "Cancel", want: map[string]codes.Code{"none": unauth, "wrong": unauth, "agent": ok, "admin": ok}},
		// Health needs no token: probes cannot send one.
		{call: "Health", want: map[string]codes.Code{"none": ok, "wrong": ok, "agent": ok, "admin": ok}},
		{call: "Reflection", want: map[string]codes.Code{"none": unauth, "wrong": unauth, "agent": ok, "admin": ok}},
		{call: "GetAccount", want: map[string]codes.Code{"none": unauth, "wrong": unauth, "agent": denied, "admin": ok}},
		{call: "ListAccounts", want: map[string]codes.Code{"none": unauth, "wrong": unauth, "agent": denied, "admin": ok}},
		{call: "SetRate", want: map[string]codes.Code{"none": unauth, "wrong": unauth, "agent": denied, "admin": ok}},
		{call: "SetBudget", want: map[string]codes.Code{"none": unauth, "wrong": unauth, "agent": denied, "admin": ok}},
	}
	for _, tt := range tests {
		for _, tokName := range []string{"none", "wrong", "agent", "admin"} {
			t.Run(tt.call+"/"+tokName, func(t *testing.T) {
				cc := srv.Dial(tokens[tokName], nil)
				err := calls[tt.call](t.Context(), cc)
				if got := status.Code(err); got != tt.want[tokName] {
					t.Fatalf("%s with %s token: code %v (%v), want %v", tt.call, tokName, got, err, tt.want[tokName])
				}
				if err != nil {
					msg := status.Convert(err).Message()
					for _, secret := range []bearer.Token{srv.AdminToken, srv.AgentToken} {
						if strings.Contains(msg, secret.Reveal()) {
							t.Errorf("error message leaks a token: %q", msg)
						}
					}
				}
			})
		}
	}
}

// The scheme is case-insensitive, and a raw token without "Bearer " is refused.
func TestAuthHeaderForms(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	srv.Register(key)
	cc := srv.Dial(bearer.Token{}, nil)
	client := controlplanev1.NewAdmissionServiceClient(cc)
	tests := []struct {
		header string
		want   codes.Code
	}{
		{"Bearer " + srv.AgentToken.Reveal(), codes.OK},
		{"bearer " + srv.AgentToken.Reveal(), codes.OK},
		{srv.AgentToken.Reveal(), codes.Unauthenticated},
		{"Basic " + srv.AgentToken.Reveal(), codes.Unauthenticated},
		{"Bearer ", codes.Unauthenticated},
		{"Bearer " + srv.AgentToken.Reveal() + "x", codes.Unauthenticated},
	}
	for _, tt := range tests {
		ctx := metadataCtx(t.Context(), "authorization", tt.header)
		_, err := client.Admit(ctx, &controlplanev1.AdmitRequest{Account: key})
		if got := status.Code(err); got != tt.want {
			t.Errorf("Admit with authorization %.12q...: %v, want %v", tt.header, got, tt.want)
		}
	}
}

func TestAdmitDecisionsAndVersion(t *testing.T) {
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(key)
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	ctx := t.Context()

	admit := func() *controlplanev1.AdmitResponse {
		t.Helper()
		resp, err := admission.Admit(ctx, &controlplanev1.AdmitRequest{Account: key})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// Default policy: burst 10 at 60/min, bound 4833ms.
	for i := range 10 {
		if r := admit(); r.GetDecision() != controlplanev1.Decision_DECISION_ADMIT || r.GetPolicyVersion() != 0 || r.GetReservationId() != "" {
			t.Fatalf("admit %d = %v, want ADMIT, version 0, no reservation", i+1, r)
		}
	}
	if r := admit(); r.GetDecision() != controlplanev1.Decision_DECISION_WAIT || r.GetWaitMs() != 1000 || r.GetReservationId() == "" || !r.GetDebited() {
		t.Fatalf("admit 11 = %v, want WAIT 1000ms with a reservation", r)
	}
	for range 3 {
		admit()
	}
	r := admit()
	if r.GetDecision() != controlplanev1.Decision_DECISION_REFUSE || r.GetRetryAfterMs() != 4000 || r.GetRequiredWaitMs() != 5000 || r.GetDebited() || r.GetWaitMs() != 0 {
		t.Fatalf("admit 15 = %v, want REFUSE retry_after 4000ms, required 5000ms", r)
	}

	set, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 600, Burst: proto.Int32(100)})
	if err != nil {
		t.Fatal(err)
	}
	if set.GetAccount().GetPolicyVersion() != 1 || set.GetAccount().GetRatePerMinute() != 600 || set.GetAccount().GetBurst() != 100 {
		t.Fatalf("SetRate = %v, want version 1, 600/min, burst 100", set.GetAccount())
	}
	clk.Advance(time.Minute)
	if r := admit(); r.GetDecision() != controlplanev1.Decision_DECISION_ADMIT || r.GetPolicyVersion() != 1 {
		t.Fatalf("admit after SetRate = %v, want ADMIT under version 1", r)
	}
}

func TestCancelRefundsOnce(t *testing.T) {
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	srv.Register(key)
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	ctx := t.Context()
	var last *controlplanev1.AdmitResponse
	for range 12 { // 10 admitted, then waits of 1s and 2s
		var err error
		if last, err = admission.Admit(ctx, &controlplanev1.AdmitRequest{Account: key}); err != nil {
			t.Fatal(err)
		}
	}
	if last.GetWaitMs() != 2000 {
		t.Fatalf("12th admit = %v, want a 2000ms wait", last)
	}
	tokens := func() float64 {
		a, err := admin.GetAccount(ctx, &controlplanev1.GetAccountRequest{Key: key})
		if err != nil {
			t.Fatal(err)
		}
		return a.GetAccount().GetTokens()
	}
	if got := tokens(); got != -2 {
		t.Fatalf("tokens = %v, want -2", got)
	}
	cancel := func(id string) bool {
		t.Helper()
		resp, err := admission.Cancel(ctx, &controlplanev1.CancelRequest{Account: key, ReservationId: id})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetRefunded()
	}
	if !cancel(last.GetReservationId()) {
		t.Error("first Cancel refunded = false, want true")
	}
	if got := tokens(); got != -1 {
		t.Errorf("tokens after cancel = %v, want -1", got)
	}
	if cancel(last.GetReservationId()) {
		t.Error("second Cancel refunded = true, want false")
	}
	if got := tokens(); got != -1 {
		t.Errorf("tokens after second cancel = %v, want -1", got)
	}
}

func TestInvalidArgument(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	ctx := t.Context()
	tests := []struct {
		name string
		call func() error
		want string
	}{
		{"rate 601", func() error {
			_, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 601})
			return err
		}, "rate_per_minute 601 is out of range; allowed 0..600"},
		{"rate -1", func() error {
			_, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: -1})
			return err
		}, "rate_per_minute -1 is out of range; allowed 0..600"},
		{"burst 0", func() error {
			_, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 60, Burst: proto.Int32(0)})
			return err
		}, "burst 0 is out of range; allowed 1..1000"},
		{"burst 1001", func() error {
			_, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 60, Burst: proto.Int32(1001)})
			return err
		}, "burst 1001 is out of range; allowed 1..1000"},
		{"idle too small", func() error {
			_, err := admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, IdleTimeoutMs: proto.Int64(5000)})
			return err
		}, "idle_timeout_ms 5000 is out of range; allowed 10000..3600000"},
		{"idle huge", func() error {
			_, err := admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, IdleTimeoutMs: proto.Int64(1 << 62)})
			return err
		}, "idle_timeout_ms 4611686018427387904 is out of range; allowed 10000..3600000"},
		{"retries 11", func() error {
			_, err := admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, MaxRetries: proto.Int32(11)})
			return err
		}, "max_retries 11 is out of range; allowed 0..10"},
		{"ladder does not fit", func() error {
			_, err := admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, IdleTimeoutMs: proto.Int64(10000), MaxRetries: proto.Int32(5)})
			return err
		}, "max_retries 5 does not fit the 10000ms idle timeout: its backoff ladder takes 62000ms; the largest that fits is 2"},
		{"empty budget", func() error {
			_, err := admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key})
			return err
		}, "set at least one of idle_timeout_ms, total_timeout_ms, max_retries"},
		{"empty key", func() error {
			_, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{RatePerMinute: 60})
			return err
		}, "key: account key is empty"},
		{"admit bad key", func() error {
			_, err := admission.Admit(ctx, &controlplanev1.AdmitRequest{Account: "has space"})
			return err
		}, "allowed printable ASCII without spaces"},
		{"cancel bad reservation", func() error {
			_, err := admission.Cancel(ctx, &controlplanev1.CancelRequest{Account: key, ReservationId: "x"})
			return err
		}, `reservation_id "x" is invalid`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tt.want) {
				t.Errorf("error = %v, want InvalidArgument containing %q", err, tt.want)
			}
		})
	}
	// Nothing was stored by the rejected calls.
	if _, err := admin.GetAccount(ctx, &controlplanev1.GetAccountRequest{Key: key}); status.Code(err) != codes.NotFound {
		t.Errorf("GetAccount after rejected updates: %v, want NotFound", err)
	}
}

func TestSetBudgetDerivesWaitBound(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	resp, err := admin.SetBudget(t.Context(), &controlplanev1.SetBudgetRequest{Key: key, IdleTimeoutMs: proto.Int64(60000), MaxRetries: proto.Int32(3)})
	if err != nil {
		t.Fatal(err)
	}
	a := resp.GetAccount()
	// bound = min(15000, floor((60000 - 2000*(2^3-1)) / 2 / 4)) = 5750
	if a.GetWaitBoundMs() != 5750 || a.GetIdleTimeoutMs() != 60000 || a.GetTotalTimeoutMs() != 600000 || a.GetMaxRetries() != 3 {
		t.Errorf("SetBudget = %v, want wait bound 5750ms, idle 60000, total 600000, retries 3", a)
	}
	if !a.GetCustom() || a.GetRatePerMinute() != 60 || a.GetBurst() != 10 {
		t.Errorf("SetBudget = %v, want custom with the default rate and burst", a)
	}
}

func TestGetAccountNotFound(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	_, err := admin.GetAccount(t.Context(), &controlplanev1.GetAccountRequest{Key: account.Key("nobody")})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "account not found") {
		t.Errorf("GetAccount(unknown) = %v, want NotFound", err)
	}
}

func TestPersistenceAcrossRestart(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	ctx := t.Context()
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	if _, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 30, Burst: proto.Int32(5)}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, MaxRetries: proto.Int32(3)}); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	admin = controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	resp, err := admin.GetAccount(ctx, &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	a := resp.GetAccount()
	if a.GetRatePerMinute() != 30 || a.GetBurst() != 5 || a.GetMaxRetries() != 3 || a.GetPolicyVersion() != 2 || a.GetTokens() != 5 {
		t.Errorf("after restart = %v, want 30/min burst 5, 3 retries, version 2, a full bucket", a)
	}
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	r, err := admission.Admit(ctx, &controlplanev1.AdmitRequest{Account: key})
	if err != nil {
		t.Fatal(err)
	}
	if r.GetPolicyVersion() != 2 {
		t.Errorf("Admit after restart: policy_version %d, want 2", r.GetPolicyVersion())
	}
}

// 64 goroutines call Admit over 1000 accounts through one real listener.
// Every account ends with exactly as many tokens spent as admissions
// reported debited.
func TestConcurrentAdmit(t *testing.T) {
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now})
	conns := []*grpc.ClientConn{srv.Dial(srv.AgentToken, nil), srv.Dial(srv.AgentToken, nil)}
	const workers, accounts, perWorker = 64, 1000, 40
	keys := make([]string, accounts)
	for i := range keys {
		keys[i] = account.Key(fmt.Sprintf("account-%d", i))
	}
	srv.Register(keys...)
	var (
		mu      sync.Mutex
		debited = map[string]int{}
		wg      sync.WaitGroup
	)
	for w := range workers {
		wg.Go(func() {
			client := controlplanev1.NewAdmissionServiceClient(conns[w%len(conns)])
			local := map[string]int{}
			for i := range perWorker {
				k := keys[(w*perWorker+i*7)%accounts]
				r, err := client.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: k})
				if err != nil {
					t.Error(err)
					return
				}
				if r.GetDebited() {
					local[k]++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for k, n := range local {
				debited[k] += n
			}
		})
	}
	wg.Wait()
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	list, err := admin.ListAccounts(t.Context(), &controlplanev1.ListAccountsRequest{PageSize: accounts})
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, a := range list.GetAccounts() {
		if want := float64(10 - debited[a.GetKey()]); a.GetTokens() != want {
			t.Errorf("%s tokens = %v, want %v", a.GetKey(), a.GetTokens(), want)
		}
		total += debited[a.GetKey()]
	}
	if total != workers*perWorker {
		t.Errorf("debited %d admissions, want %d (every admission in burst)", total, workers*perWorker)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, Registerer: reg})
	srv.Register(key)
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	for range 15 {
		if _, err := admission.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: key}); err != nil {
			t.Fatal(err)
		}
	}
	got := gather(t, reg)
	want := map[string]float64{
		`clodex_controlplane_admissions_total{decision="admit"}`:             10,
		`clodex_controlplane_admissions_total{decision="wait"}`:              4,
		`clodex_controlplane_admissions_total{decision="refuse"}`:            1,
		`clodex_controlplane_admission_wait_seconds_count{}`:                 4,
		`clodex_controlplane_admission_wait_seconds_sum{}`:                   10, // 1+2+3+4 s
		`clodex_controlplane_account_tokens{account="` + key + `"}`:          -4,
		`clodex_controlplane_account_rate_per_minute{account="` + key + `"}`: 60,
	}
	for name, w := range want {
		if v, ok := got[name]; !ok || v != w {
			t.Errorf("%s = %v (present %v), want %v", name, v, ok, w)
		}
	}
}

// gather flattens a registry into "name{label="v",...}" -> value; a
// histogram gives name_count and name_sum.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			ls := "{" + strings.Join(labels, ",") + "}"
			switch {
			case m.GetCounter() != nil:
				out[mf.GetName()+ls] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[mf.GetName()+ls] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[mf.GetName()+"_count"+ls] = float64(m.GetHistogram().GetSampleCount())
				out[mf.GetName()+"_sum"+ls] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

func countSeries(t *testing.T, reg *prometheus.Registry, prefix string) int {
	t.Helper()
	n := 0
	for name := range gather(t, reg) {
		if strings.HasPrefix(name, prefix+"{") {
			n++
		}
	}
	return n
}

// Per-account gauges stay bounded however many accounts are admitted.
func TestMetricsAccountBound(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Registerer: reg})
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	keys := make([]string, 150)
	for i := range keys {
		keys[i] = account.Key(fmt.Sprint(i))
	}
	srv.Register(keys...)
	for i := range 150 {
		if _, err := admission.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: account.Key(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	if n := countSeries(t, reg, "clodex_controlplane_account_tokens"); n != 100 {
		t.Errorf("account_tokens series = %d, want 100", n)
	}
}

func TestBenchServiceOnlyWhenEnabled(t *testing.T) {
	for _, enabled := range []bool{false, true} {
		srv := controlplanetest.Start(t, &controlplanetest.Options{EnableBench: enabled})
		_, err := controlplanev1.NewBenchServiceClient(srv.Dial(srv.AgentToken, nil)).Noop(t.Context(), &controlplanev1.NoopRequest{Account: key})
		want := codes.Unimplemented
		if enabled {
			want = codes.OK
		}
		if got := status.Code(err); got != want {
			t.Errorf("Noop with EnableBench=%v: %v, want %v", enabled, got, want)
		}
		_, err = controlplanev1.NewBenchServiceClient(srv.Dial(bearer.Token{}, nil)).Noop(t.Context(), &controlplanev1.NoopRequest{Account: key})
		if enabled && status.Code(err) != codes.Unauthenticated {
			t.Errorf("Noop without a token: %v, want Unauthenticated", err)
		}
	}
}

// Shutdown marks health NOT_SERVING for watchers and ends even though a
// health Watch stream never finishes on its own: GracefulStop is bounded.
func TestShutdownBounded(t *testing.T) {
	srv := controlplanetest.Start(t, &controlplanetest.Options{ShutdownGrace: 200 * time.Millisecond})
	cc := srv.Dial(srv.AgentToken, nil)
	stream, err := healthpb.NewHealthClient(cc).Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first health = %v, %v; want SERVING", r, err)
	}
	stopped := make(chan struct{})
	go func() {
		srv.Stop()
		close(stopped)
	}()
	r, err := stream.Recv()
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health during shutdown = %v, %v; want NOT_SERVING", r, err)
	}
	<-stopped // returns only because Stop follows the grace
	if _, err := stream.Recv(); err == nil {
		t.Error("watch stream still open after shutdown")
	}
}

// syncBuffer is a bytes.Buffer safe for the server's concurrent logging.
type syncBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A policy without retries cannot refuse: the operator is told when it is
// set, and once per account when admissions go past the ceiling.
func TestNoRefusePolicyNotices(t *testing.T) {
	var logs syncBuffer
	clk := newClock()
	srv := controlplanetest.Start(t, &controlplanetest.Options{Now: clk.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	ctx := t.Context()
	if _, err := admin.SetRate(ctx, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 60, Burst: proto.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	resp, err := admin.SetBudget(ctx, &controlplanev1.SetBudgetRequest{Key: key, MaxRetries: proto.Int32(0)})
	if err != nil {
		t.Fatal(err)
	}
	// bound = min(15000, 120000/2/1) = 15000ms
	if a := resp.GetAccount(); a.GetCanRefuse() || a.GetWaitBoundMs() != 15000 {
		t.Fatalf("account = %v, want can_refuse false, wait bound 15000ms", a)
	}
	if !strings.Contains(logs.String(), "without refusing overflow") {
		t.Errorf("no no-refuse notice after SetBudget:\n%s", logs.String())
	}
	// 1 admit, 15 waits of 1..15 s, then admissions past the ceiling.
	var relaxed int
	for i := range 20 {
		r, err := admission.Admit(ctx, &controlplanev1.AdmitRequest{Account: key})
		if err != nil {
			t.Fatal(err)
		}
		if r.GetDecision() == controlplanev1.Decision_DECISION_REFUSE {
			t.Fatalf("admit %d refused under a policy that cannot refuse", i+1)
		}
		if r.GetRelaxed() {
			relaxed++
			if r.GetDebited() || r.GetDecision() != controlplanev1.Decision_DECISION_ADMIT {
				t.Errorf("relaxed admit %d = %v, want ADMIT without debit", i+1, r)
			}
		}
	}
	if relaxed != 4 {
		t.Errorf("relaxed admissions = %d, want 4 (20 - 1 admit - 15 waits)", relaxed)
	}
	if n := strings.Count(logs.String(), "past the 60/minute ceiling"); n != 1 {
		t.Errorf("relaxed notice logged %d times, want once:\n%s", n, logs.String())
	}
}
