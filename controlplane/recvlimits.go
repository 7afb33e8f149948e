package controlplane

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the "proto" codec recvCodec wraps
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Receive limits: how large one request message of each method may be,
// sized to its largest legitimate message (limits_test.go builds each
// one and checks it fits).
//
// grpc-go checks a message's length prefix against one limit for the
// whole server (grpc.MaxRecvMsgSize), before it reads a byte of the body;
// nothing earlier sees the method's message. The first hook that can tell
// methods apart before a message is decoded is the codec: it receives
// the message's bytes (already read, at most the server's limit) and the
// type to decode into, and every method has a request type of its own.
// So the server's limit is the largest method's (MaxRecvMsgSize, 32 KiB),
// which bounds what any caller makes the server read, and recvCodec
// refuses a message over its own method's limit without decoding it. A
// codec error would reach the caller as Internal, so recvCodec marks the
// undecoded message instead and the interceptors answer
// ResourceExhausted (checkSize) before any other work.
const (
	// recvSmall fits a request of scalars, an account key and a page
	// token: Admit and Cancel are under 300 bytes.
	recvSmall = 1 << 10
	// recvReflection fits a reflection request (symbol and file names).
	recvReflection = 4 << 10
	// recvMember fits a CreateMember of 100 accounts (about 2.5 KB).
	recvMember = 4 << 10
	// MaxRecvMsgSize is the largest request message the server reads:
	// the largest per-method limit (an agent hello or heartbeat naming
	// 1000 accounts, about 24 KB; a usage report, which data planes keep
	// under 30 KiB; a ReportGrants of 200 accounts with
	// 128-byte keys, about 32 KB; an agent credential of 1000 accounts; a
	// login's tokens; a chunk of a backup file being restored). A longer message is refused from its length prefix,
	// before its body is read.
	MaxRecvMsgSize = 32 << 10
)

// recvLimits is the limit of each request type, by its full name.
var recvLimits = func() map[protoreflect.FullName]int {
	m := map[protoreflect.FullName]int{}
	set := func(n int, msgs ...proto.Message) {
		for _, msg := range msgs {
			m[msg.ProtoReflect().Descriptor().FullName()] = n
		}
	}
	set(recvSmall,
		&controlplanev1.AdmitRequest{}, &controlplanev1.CancelRequest{}, &controlplanev1.NoopRequest{},
		&controlplanev1.GetTokenRequest{}, &controlplanev1.ServedAccountsRequest{},
		&controlplanev1.SetRateRequest{}, &controlplanev1.SetBudgetRequest{}, &controlplanev1.GetAccountRequest{},
		&controlplanev1.ListAccountsRequest{}, &controlplanev1.ListAgentsRequest{}, &controlplanev1.SetAdaptiveRequest{},
		&controlplanev1.ListQuotasRequest{}, &controlplanev1.GetUsageRequest{}, &controlplanev1.ListLoginsRequest{}, &controlplanev1.GetLoginRequest{},
		&controlplanev1.RemoveLoginRequest{}, &controlplanev1.ListAgentCredentialsRequest{},
		&controlplanev1.RemoveAgentCredentialRequest{}, &controlplanev1.CreateConsoleLinkRequest{},
		&controlplanev1.BackupRequest{}, &controlplanev1.ListMembersRequest{}, &controlplanev1.RemoveMemberRequest{},
		&healthpb.HealthCheckRequest{}, &healthpb.HealthListRequest{})
	set(recvMember, &controlplanev1.CreateMemberRequest{})
	set(recvReflection, &reflectionv1.ServerReflectionRequest{})
	// The deprecated v1alpha reflection service reflection.Register still
	// serves, by name: its package is deprecated.
	m["grpc.reflection.v1alpha.ServerReflectionRequest"] = recvReflection
	set(MaxRecvMsgSize,
		&controlplanev1.ConnectRequest{}, &controlplanev1.ReportGrantsRequest{},
		&controlplanev1.CreateAgentCredentialRequest{}, &controlplanev1.ImportLoginRequest{},
		&controlplanev1.RestoreRequest{}) // a chunk of a backup file, at most MaxRestoreChunk
	return m
}()

// recvLimit returns the limit of a request type; a type the table does
// not name (none of the server's methods: limits_test.go checks) gets
// recvSmall.
func recvLimit(name protoreflect.FullName) int {
	if n, ok := recvLimits[name]; ok {
		return n
	}
	return recvSmall
}

// tooLargeField is the field number of the mark recvCodec leaves on a
// message it refused to decode, holding the message's size. Numbers
// 19000..19999 are reserved to the protobuf implementation: no .proto
// declares them. A caller that sends the field itself only gets its own
// call refused.
const tooLargeField protowire.Number = 19999

// recvCodec is the server's codec (grpc.ForceServerCodecV2): the standard
// proto codec, except that a request over its method's limit is not
// decoded. It leaves the message empty but for the mark tooLarge reads.
type recvCodec struct{ encoding.CodecV2 }

func newRecvCodec() recvCodec { return recvCodec{encoding.GetCodecV2("proto")} }

func (c recvCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	if n := data.Len(); n > recvLimit(m.ProtoReflect().Descriptor().FullName()) {
		b := protowire.AppendTag(nil, tooLargeField, protowire.VarintType)
		m.ProtoReflect().SetUnknown(protowire.AppendVarint(b, uint64(n)))
		return nil
	}
	return c.CodecV2.Unmarshal(data, v)
}

// tooLarge returns the size recvCodec marked req with, if it refused it.
func tooLarge(req any) (int, bool) {
	m, ok := req.(proto.Message)
	if !ok {
		return 0, false
	}
	b := m.ProtoReflect().GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == tooLargeField && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			return int(min(v, 1<<31)), n >= 0
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	return 0, false
}

// checkSize refuses a request recvCodec did not decode: ResourceExhausted
// naming the method, the size and the limit. The denial is counted.
func (s *Server) checkSize(ctx context.Context, method string, req any) error {
	n, ok := tooLarge(req)
	if !ok {
		return nil
	}
	s.denied.record(ctx, method, DenyTooLarge)
	limit := recvLimit(req.(proto.Message).ProtoReflect().Descriptor().FullName())
	return status.Errorf(codes.ResourceExhausted, "%s: the request message is %d bytes; this method accepts at most %d",
		strings.TrimPrefix(method, "/"), n, limit)
}

// sizedStream refuses each received message recvCodec did not decode.
type sizedStream struct {
	grpc.ServerStream
	s      *Server
	method string
}

func (ss sizedStream) RecvMsg(m any) error {
	if err := ss.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	return ss.s.checkSize(ss.Context(), ss.method, m)
}
