package controlplane

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"slices"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane/broker"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/codexauth"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// errNoBroker answers the broker's RPCs on a control plane without one.
var errNoBroker = status.Error(codes.FailedPrecondition,
	"this control plane holds no logins: start clodex-controlplane with --credential-key-file FILE (32 random bytes in base64: head -c 32 /dev/urandom | base64) to run the credential broker")

// brokerStatus maps the broker's errors to gRPC status; anything else
// goes through storeStatus (a store failure is never Internal).
func (s *Server) brokerStatus(ctx context.Context, op string, err error) error {
	var nl *broker.NeedsLoginError
	var un *broker.UnavailableError
	switch {
	case errors.As(err, &nl):
		return status.Error(codes.FailedPrecondition, nl.Error())
	case errors.Is(err, broker.ErrInvalidLogin):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, broker.ErrUnknownAccount):
		return status.Error(codes.NotFound, err.Error())
	case errors.As(err, &un):
		return status.Error(codes.Unavailable, un.Error())
	}
	return s.storeStatus(ctx, op, err)
}

func loginProto(st broker.Status) *controlplanev1.Login {
	l := &controlplanev1.Login{
		Key: st.Key, AccountId: st.AccountID, Refreshes: st.Refreshes, NeedsLogin: st.NeedsLogin,
		RefreshedAtUnixMs: unixMs(st.Refreshed), Unreadable: st.Unreadable,
	}
	if !st.Expiry.IsZero() {
		l.ExpiresAtUnixMs = st.Expiry.UnixMilli()
	}
	return l
}

func (a *adminService) ImportLogin(ctx context.Context, req *controlplanev1.ImportLoginRequest) (*controlplanev1.ImportLoginResponse, error) {
	s := a.s
	if s.opts.Broker == nil {
		return nil, errNoBroker
	}
	st, err := s.opts.Broker.Import(ctx, codexauth.Secret(req.GetAccessToken()), codexauth.Secret(req.GetRefreshToken()),
		codexauth.Secret(req.GetIdToken()), req.GetAccountId())
	if err != nil {
		return nil, s.brokerStatus(ctx, "ImportLogin", err)
	}
	return &controlplanev1.ImportLoginResponse{Login: loginProto(st)}, nil
}

func (a *adminService) ListLogins(ctx context.Context, req *controlplanev1.ListLoginsRequest) (*controlplanev1.ListLoginsResponse, error) {
	s := a.s
	if s.opts.Broker == nil {
		return nil, errNoBroker
	}
	pg, next, err := listPage(ctx, s, "ListLogins", req, DefaultLoginsPage, MaxLoginsPage,
		s.opts.Broker.List, s.brokerStatus, loginProto, (*controlplanev1.Login).GetKey)
	if err != nil {
		return nil, err
	}
	return &controlplanev1.ListLoginsResponse{Logins: pg, NextPageToken: next}, nil
}

func (a *adminService) GetLogin(ctx context.Context, req *controlplanev1.GetLoginRequest) (*controlplanev1.GetLoginResponse, error) {
	s := a.s
	if s.opts.Broker == nil {
		return nil, errNoBroker
	}
	if err := validKey(req.GetKey()); err != nil {
		return nil, s.toStatus(ctx, "GetLogin", err)
	}
	st, err := s.opts.Broker.Get(ctx, req.GetKey())
	if err != nil {
		return nil, s.brokerStatus(ctx, "GetLogin", err)
	}
	return &controlplanev1.GetLoginResponse{Login: loginProto(st)}, nil
}

func (a *adminService) RemoveLogin(ctx context.Context, req *controlplanev1.RemoveLoginRequest) (*controlplanev1.RemoveLoginResponse, error) {
	s := a.s
	if s.opts.Broker == nil {
		return nil, errNoBroker
	}
	if err := validKey(req.GetKey()); err != nil {
		return nil, s.toStatus(ctx, "RemoveLogin", err)
	}
	if err := s.opts.Broker.Remove(ctx, req.GetKey()); err != nil {
		return nil, s.brokerStatus(ctx, "RemoveLogin", err)
	}
	return &controlplanev1.RemoveLoginResponse{}, nil
}

type credentialService struct {
	controlplanev1.UnimplementedCredentialServiceServer
	s *Server
}

var _ controlplanev1.CredentialServiceServer = (*credentialService)(nil)

func (c *credentialService) GetToken(ctx context.Context, req *controlplanev1.GetTokenRequest) (*controlplanev1.GetTokenResponse, error) {
	s := c.s
	if s.opts.Broker == nil {
		return nil, errNoBroker
	}
	key := req.GetAccount()
	if err := store.ValidateKey(key); err != nil {
		return nil, s.toStatus(ctx, "GetToken", &invalidError{msg: "account: " + err.Error()})
	}
	if err := s.checkScope(ctx, "GetToken", key); err != nil {
		return nil, err
	}
	rej := req.GetRejectedSha256()
	if len(rej) != 0 && len(rej) != sha256.Size {
		return nil, s.toStatus(ctx, "GetToken", invalidf("rejected_sha256 is %d bytes; want 0 or %d (the SHA-256 of the rejected token)", len(rej), sha256.Size))
	}
	var rejected codexauth.Secret
	if len(rej) != 0 {
		// The broker compares tokens, so find the current one first: a
		// digest that matches it names it as the rejected one.
		cur, err := s.opts.Broker.Token(ctx, key, "")
		if err != nil {
			return nil, s.brokerStatus(ctx, "GetToken", err)
		}
		sum := sha256.Sum256([]byte(cur.Access.Reveal()))
		if subtle.ConstantTimeCompare(sum[:], rej) != 1 {
			return tokenProto(cur), nil // already replaced
		}
		rejected = cur.Access
	}
	tok, err := s.opts.Broker.Token(ctx, key, rejected)
	if err != nil {
		return nil, s.brokerStatus(ctx, "GetToken", err)
	}
	return tokenProto(tok), nil
}

func tokenProto(t broker.Token) *controlplanev1.GetTokenResponse {
	r := &controlplanev1.GetTokenResponse{Account: t.Key, AccessToken: t.Access.Reveal(), AccountId: t.AccountID}
	if !t.Expiry.IsZero() {
		r.ExpiresAtUnixMs = t.Expiry.UnixMilli()
	}
	return r
}

func (c *credentialService) ServedAccounts(ctx context.Context, _ *controlplanev1.ServedAccountsRequest) (*controlplanev1.ServedAccountsResponse, error) {
	s := c.s
	if scope, ok := s.scopeOf(ctx); ok {
		return &controlplanev1.ServedAccountsResponse{Accounts: slices.Clone(scope)}, nil
	}
	if s.opts.Broker == nil {
		return nil, errNoBroker
	}
	sts, err := s.opts.Broker.List(ctx)
	if err != nil {
		return nil, s.brokerStatus(ctx, "ServedAccounts", err)
	}
	keys := make([]string, 0, len(sts))
	for _, st := range sts {
		keys = append(keys, st.Key)
	}
	return &controlplanev1.ServedAccountsResponse{Accounts: keys}, nil
}
