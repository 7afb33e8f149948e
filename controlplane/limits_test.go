package controlplane_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/controlplanetest"
	"github.com/clodex/clodex/internal/bearer"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// longKey is a valid account key of the longest length (128 bytes).
func longKey(i int) string {
	k := fmt.Sprintf("acct_%04d_", i)
	return k + strings.Repeat("f", 128-len(k))
}

// The largest legitimate message of each method is answered, and a
// message over its method's receive limit is ResourceExhausted naming the
// size and the limit, with a valid token, before the method does any work
// (an over-limit Admit registers nothing, a refused hello registers no
// agent). The sizes are measured here with proto.Size, and printed.
func TestMessageSizeLimit(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%016x", i)
	}
	grants := make([]*controlplanev1.LocalGrants, 200)
	for i := range grants {
		grants[i] = &controlplanev1.LocalGrants{Account: longKey(i), Count: 100000, FirstUnixMs: -1, LastUnixMs: -1}
	}
	maxHello := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: &controlplanev1.AgentHello{
		AgentId: strings.Repeat("i", 128), Host: strings.Repeat("h", 256), Version: strings.Repeat("v", 256),
		CapabilityVersion: int32(controlplane.CapabilityVersion), Accounts: keys,
	}}}
	maxReport := &controlplanev1.ReportGrantsRequest{ReportId: strings.Repeat("r", 128), AgentId: strings.Repeat("i", 128), Grants: grants}
	maxCred := &controlplanev1.CreateAgentCredentialRequest{Name: strings.Repeat("n", 64), Accounts: keys, TokenSha256: make([]byte, 32)}
	maxCred.TokenSha256[0] = 1
	maxAdmit := &controlplanev1.AdmitRequest{Account: longKey(1), AgentId: strings.Repeat("i", 128), Member: strings.Repeat("m", 64)}
	maxMember := &controlplanev1.CreateMemberRequest{Name: strings.Repeat("n", 64), Accounts: keys[:100], Pin: keys[99],
		RatePerMinute: 600, KeySha256: make([]byte, 32)}
	maxMember.KeySha256[0] = 1
	// A usage report of the most rows, with a 16-byte member, a 24-byte
	// model and counts of a busy minute (data planes also cut a batch at
	// 30 KiB, so longer names make fewer rows).
	usage := &controlplanev1.UsageReport{Seq: 1 << 40}
	for i := range controlplane.MaxUsageRows {
		usage.Rows = append(usage.Rows, &controlplanev1.UsageRow{MinuteUnixMs: time.Now().Truncate(time.Minute).UnixMilli(),
			Member: fmt.Sprintf("member-%010d", i), Account: keys[i%len(keys)], Model: "claude-sonnet-4-5-202509",
			Turns: 1000, InputTokens: 1 << 30, CachedTokens: 1 << 30, OutputTokens: 1 << 24, NewSockets: 1000, Refusals: 1000})
	}
	maxUsage := &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Usage{Usage: usage}}
	for _, tt := range []struct {
		name  string
		msg   proto.Message
		limit int
	}{
		{"AgentService.Connect hello of 1000 accounts", maxHello, controlplane.MaxRecvMsgSize},
		{"ReportGrants of 200 accounts with 128-byte keys", maxReport, controlplane.MaxRecvMsgSize},
		{"CreateAgentCredential of 1000 accounts", maxCred, controlplane.MaxRecvMsgSize},
		{"Admit with a 128-byte key and agent id", maxAdmit, 1024},
		{"CreateMember of 100 accounts", maxMember, 4096},
		{"AgentService.Connect usage report of 200 rows", maxUsage, controlplane.MaxRecvMsgSize},
	} {
		t.Logf("%s: %d bytes (limit %d)", tt.name, proto.Size(tt.msg), tt.limit)
		if n := proto.Size(tt.msg); n > tt.limit {
			t.Errorf("%s is %d bytes, over its limit %d", tt.name, n, tt.limit)
		}
	}

	recvPolicy(t, connect(t, srv, maxHello))
	admin := srv.Dial(srv.AdminToken, nil)
	resp, err := controlplanev1.NewAdmissionServiceClient(admin).ReportGrants(t.Context(), maxReport)
	if err != nil || len(resp.GetDebits()) != len(grants) {
		t.Errorf("ReportGrants of 200 accounts with 128-byte keys = %d debits, %v; want 200", len(resp.GetDebits()), err)
	}
	if _, err := controlplanev1.NewAdminServiceClient(admin).CreateAgentCredential(t.Context(), maxCred); err != nil {
		t.Errorf("CreateAgentCredential of 1000 accounts = %v, want it created", err)
	}
	if _, err := controlplanev1.NewAdminServiceClient(admin).CreateMember(t.Context(), maxMember); err != nil {
		t.Errorf("CreateMember of 100 accounts = %v, want it created", err)
	}
	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	// The agent credential already serves 1000 accounts: the answer is
	// its account cap, decided on the decoded message.
	if _, err := admission.Admit(t.Context(), maxAdmit); err == nil || strings.Contains(err.Error(), "request message") {
		t.Errorf("Admit with a 128-byte key = %v, want the account cap's answer", err)
	}

	// Over the method's own limit, under the server's: refused before
	// the message is decoded, with the method, the size and the limit.
	big := &controlplanev1.AdmitRequest{Account: strings.Repeat("a", 2000)}
	_, err = admission.Admit(t.Context(), big)
	want := fmt.Sprintf("clodex.controlplane.v1.AdmissionService/Admit: the request message is %d bytes; this method accepts at most 1024", proto.Size(big))
	if status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != want {
		t.Errorf("Admit of %d bytes = %v, want ResourceExhausted %q", proto.Size(big), err, want)
	}
	hc := healthpb.NewHealthClient(srv.Dial(bearer.Token{}, nil))
	if _, err := hc.Check(t.Context(), &healthpb.HealthCheckRequest{Service: strings.Repeat("s", 2000)}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("health Check without a token and a 2000-byte service name = %v, want ResourceExhausted", err)
	}
	// Over the server's limit: refused from the length prefix.
	over := &controlplanev1.ReportGrantsRequest{ReportId: "r", Grants: append(grants, grants[:50]...)}
	if _, err := controlplanev1.NewAdmissionServiceClient(admin).ReportGrants(t.Context(), over); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("ReportGrants of %d bytes = %v, want ResourceExhausted", proto.Size(over), err)
	}
	// A hello over the stream's limit ends the stream; no agent joined.
	st := connect(t, srv, &controlplanev1.ConnectRequest{Msg: &controlplanev1.ConnectRequest_Hello{Hello: &controlplanev1.AgentHello{
		AgentId: "too-big", CapabilityVersion: 1, Host: strings.Repeat("h", controlplane.MaxRecvMsgSize)}}})
	if _, err := st.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a hello over the limit: Recv = %v, want ResourceExhausted", err)
	}
	agents, err := controlplanev1.NewAdminServiceClient(admin).ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{})
	if err != nil || len(agents.GetAgents()) != 1 {
		t.Errorf("ListAgents = %d agents, %v; want only the maximal hello's agent", len(agents.GetAgents()), err)
	}
	us := connect(t, srv, helloUsage("usage-agent", keys[0]))
	if err := us.Send(maxUsage); err != nil {
		t.Fatal(err)
	}
	if a := recvAck(t, us); a.GetRefused() != "" {
		t.Errorf("usage report of 200 rows: ack %v, want it stored", a)
	}
}

// ListAccounts and ListAgents answer in pages: each page token leads to
// the next, the last page has none, and bad page sizes and tokens are
// InvalidArgument naming what is allowed.
func TestListPages(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	admin := controlplanev1.NewAdminServiceClient(srv.Dial(srv.AdminToken, nil))
	var want []string
	for i := range 5 {
		k := fmt.Sprintf("acct_%016x", i)
		want = append(want, k)
		if _, err := admin.SetRate(t.Context(), &controlplanev1.SetRateRequest{Key: k, RatePerMinute: 30}); err != nil {
			t.Fatal(err)
		}
	}
	var got, tokens []string
	req := &controlplanev1.ListAccountsRequest{PageSize: 2}
	for range 10 {
		resp, err := admin.ListAccounts(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetAccounts()) > 2 {
			t.Fatalf("page of size 2 has %d accounts", len(resp.GetAccounts()))
		}
		for _, a := range resp.GetAccounts() {
			got = append(got, a.GetKey())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		tokens = append(tokens, resp.GetNextPageToken())
		req.PageToken = resp.GetNextPageToken()
	}
	if strings.Join(got, ",") != strings.Join(want, ",") || len(tokens) != 2 {
		t.Errorf("pages of 2 = %v with %d page tokens, want %v in 3 pages", got, len(tokens), want)
	}
	resp, err := admin.ListAccounts(t.Context(), &controlplanev1.ListAccountsRequest{})
	if err != nil || len(resp.GetAccounts()) != 5 || resp.GetNextPageToken() != "" {
		t.Errorf("default page = %d accounts, next %q, %v; want all 5 and no next page", len(resp.GetAccounts()), resp.GetNextPageToken(), err)
	}

	bad := []struct {
		req  *controlplanev1.ListAccountsRequest
		want string
	}{
		{&controlplanev1.ListAccountsRequest{PageSize: -1}, "page_size -1 is out of range; allowed 1..1000, or 0 for 500"},
		{&controlplanev1.ListAccountsRequest{PageSize: 1001}, "page_size 1001 is out of range; allowed 1..1000, or 0 for 500"},
		{&controlplanev1.ListAccountsRequest{PageToken: "not a token"}, "page_token is not one this server returned"},
	}
	for _, tt := range bad {
		_, err := admin.ListAccounts(t.Context(), tt.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("ListAccounts(%v) = %v, want InvalidArgument containing %q", tt.req, err, tt.want)
		}
	}

	for _, id := range []string{"agent-c", "agent-a", "agent-b"} {
		recvPolicy(t, connect(t, srv, hello(id, want[0])))
	}
	var ids []string
	areq := &controlplanev1.ListAgentsRequest{PageSize: 2}
	for range 10 {
		resp, err := admin.ListAgents(t.Context(), areq)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range resp.GetAgents() {
			ids = append(ids, a.GetId())
		}
		if resp.GetNextPageToken() == "" {
			break
		}
		areq.PageToken = resp.GetNextPageToken()
	}
	if strings.Join(ids, ",") != "agent-a,agent-b,agent-c" {
		t.Errorf("agents in pages of 2 = %v, want agent-a,agent-b,agent-c", ids)
	}
	if _, err := admin.ListAgents(t.Context(), &controlplanev1.ListAgentsRequest{PageSize: 101}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(err.Error(), "page_size 101 is out of range; allowed 1..100, or 0 for 20") {
		t.Errorf("ListAgents(page_size 101) = %v, want InvalidArgument naming 1..100", err)
	}
}
