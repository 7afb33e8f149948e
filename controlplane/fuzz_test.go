package controlplane_test

import (
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/clodex/clodex/controlplane/controlplanetest"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// rawCodec sends a request's bytes as they are, so the fuzzer's bytes
// reach the server's decoder unchanged (unknown fields, odd encodings).
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

// fuzzRPC is one RPC a caller can send: its full method name, whose token
// it needs, and its request type.
type fuzzRPC struct {
	method string
	agent  bool // the agent token; else the admin token
	req    func() proto.Message
}

var fuzzRPCs = []fuzzRPC{
	{"/clodex.controlplane.v1.AdmissionService/Admit", true, func() proto.Message { return &controlplanev1.AdmitRequest{} }},
	{"/clodex.controlplane.v1.AdmissionService/Cancel", true, func() proto.Message { return &controlplanev1.CancelRequest{} }},
	{"/clodex.controlplane.v1.AdmissionService/ReportGrants", true, func() proto.Message { return &controlplanev1.ReportGrantsRequest{} }},
	{"/clodex.controlplane.v1.AdminService/SetRate", false, func() proto.Message { return &controlplanev1.SetRateRequest{} }},
	{"/clodex.controlplane.v1.AdminService/SetBudget", false, func() proto.Message { return &controlplanev1.SetBudgetRequest{} }},
	{"/clodex.controlplane.v1.AdminService/SetAdaptive", false, func() proto.Message { return &controlplanev1.SetAdaptiveRequest{} }},
	{"/clodex.controlplane.v1.AdminService/GetAccount", false, func() proto.Message { return &controlplanev1.GetAccountRequest{} }},
	{"/clodex.controlplane.v1.AdminService/ListAccounts", false, func() proto.Message { return &controlplanev1.ListAccountsRequest{} }},
	{"/clodex.controlplane.v1.AdminService/ListAgents", false, func() proto.Message { return &controlplanev1.ListAgentsRequest{} }},
}

// FuzzRPCRequests sends arbitrary request bytes to the control plane's
// unary RPCs, over its real gRPC listener with the right token: whatever
// decodes as the request type is answered OK or with a status naming what
// was wrong (InvalidArgument, NotFound, PermissionDenied, ...), never
// Internal or Unknown, never a crash. It covers every validator the RPCs
// run (account keys, rates, budgets, reservation and report ids, page
// tokens).
func FuzzRPCRequests(f *testing.F) {
	seed := func(i int, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(i), b)
	}
	const key = "acct_0123456789abcdef"
	seed(0, &controlplanev1.AdmitRequest{Account: key})
	seed(0, &controlplanev1.AdmitRequest{Account: "has space"})
	seed(1, &controlplanev1.CancelRequest{Account: key, ReservationId: "x"})
	seed(2, &controlplanev1.ReportGrantsRequest{})
	seed(3, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 60, Burst: proto.Int32(10)})
	seed(3, &controlplanev1.SetRateRequest{Key: key, RatePerMinute: 601})
	seed(4, &controlplanev1.SetBudgetRequest{Key: key, IdleTimeoutMs: proto.Int64(10000), MaxRetries: proto.Int32(5)})
	seed(4, &controlplanev1.SetBudgetRequest{Key: key, TotalTimeoutMs: proto.Int64(1 << 62)})
	seed(5, &controlplanev1.SetAdaptiveRequest{Key: key})
	seed(6, &controlplanev1.GetAccountRequest{Key: key})
	seed(7, &controlplanev1.ListAccountsRequest{})
	seed(8, &controlplanev1.ListAgentsRequest{})

	srv := controlplanetest.Start(f, nil)
	admin, agent := srv.Dial(srv.AdminToken, nil), srv.Dial(srv.AgentToken, nil)
	allowed := map[codes.Code]bool{
		codes.OK: true, codes.InvalidArgument: true, codes.NotFound: true, codes.PermissionDenied: true,
		codes.ResourceExhausted: true, codes.FailedPrecondition: true, codes.OutOfRange: true, codes.AlreadyExists: true,
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		rpc := fuzzRPCs[int(which)%len(fuzzRPCs)]
		if proto.Unmarshal(body, rpc.req()) != nil {
			return // gRPC's own decoder refuses it before any handler
		}
		cc := admin
		if rpc.agent {
			cc = agent
		}
		var reply []byte
		err := cc.Invoke(t.Context(), rpc.method, &body, &reply, grpc.ForceCodec(rawCodec{}))
		st := status.Convert(err)
		if !allowed[st.Code()] {
			t.Fatalf("%s(%x) = %v; want OK or a status naming the problem", rpc.method, body, err)
		}
		if st.Code() != codes.OK && st.Message() == "" {
			t.Fatalf("%s(%x) = %v with an empty message", rpc.method, body, st.Code())
		}
	})
}
