package controlplane_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/controlplanetest"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// longKey is a valid account key of the longest length (128 bytes).
func longKey(i int) string {
	k := fmt.Sprintf("acct_%04d_", i)
	return k + strings.Repeat("f", 128-len(k))
}

// The largest legitimate messages fit the receive limit (a hello listing
// 1000 keys, a ReportGrants of 1000 accounts with 128-byte keys); a bigger
// message is ResourceExhausted, even with a valid token.
func TestMessageSizeLimit(t *testing.T) {
	srv := controlplanetest.Start(t, nil)
	keys := make([]string, 1000)
	grants := make([]*controlplanev1.LocalGrants, len(keys))
	for i := range keys {
		keys[i] = fmt.Sprintf("acct_%016x", i)
		grants[i] = &controlplanev1.LocalGrants{Account: longKey(i), Count: 100000, FirstUnixMs: 1 << 62, LastUnixMs: 1 << 62}
	}
	st := connect(t, srv, hello(strings.Repeat("i", 128), keys...))
	recvPolicy(t, st)

	// With the admin token (an operator's): 1000 new 128-byte keys on
	// top of the hello's 1000 would pass the agent credential's cap.
	resp, err := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AdminToken, nil)).ReportGrants(t.Context(), &controlplanev1.ReportGrantsRequest{
		ReportId: strings.Repeat("r", 128), AgentId: strings.Repeat("i", 128), Grants: grants,
	})
	if err != nil || len(resp.GetDebits()) != len(keys) {
		t.Fatalf("ReportGrants of 1000 accounts with 128-byte keys = %d debits, %v; want 1000", len(resp.GetDebits()), err)
	}

	admission := controlplanev1.NewAdmissionServiceClient(srv.Dial(srv.AgentToken, nil))
	_, err = admission.Admit(t.Context(), &controlplanev1.AdmitRequest{Account: strings.Repeat("a", controlplane.MaxRecvMsgSize)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("Admit with a %d-byte account = %v, want ResourceExhausted", controlplane.MaxRecvMsgSize, err)
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
