package controlplane

import (
	"context"
	"time"

	"github.com/clodex/clodex/controlplane/console"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// ConsoleLinks issues the web console's one-time sign-in links
// (Options.ConsoleLinks; *console.Links implements it).
type ConsoleLinks interface {
	Issue(operator string) (url string, expires time.Time, err error)
}

// maxOperator bounds CreateConsoleLinkRequest.operator.
const maxOperator = 64

func (a *adminService) CreateConsoleLink(ctx context.Context, req *controlplanev1.CreateConsoleLinkRequest) (*controlplanev1.CreateConsoleLinkResponse, error) {
	s := a.s
	op := req.GetOperator()
	if err := validOperator(op); err != nil {
		return nil, s.toStatus(ctx, "CreateConsoleLink", err)
	}
	if s.opts.ConsoleLinks == nil {
		return nil, s.toStatus(ctx, "CreateConsoleLink", console.ErrNoConsole)
	}
	url, exp, err := s.opts.ConsoleLinks.Issue(op)
	if err != nil {
		return nil, s.toStatus(ctx, "CreateConsoleLink", err)
	}
	s.log.InfoContext(ctx, "console sign-in link issued", "operator", op, "expires", exp.UTC().Format(time.RFC3339))
	return &controlplanev1.CreateConsoleLinkResponse{Url: url, ExpiresUnixMs: exp.UnixMilli()}, nil
}

func validOperator(op string) error {
	if op == "" || len(op) > maxOperator {
		return invalidf("operator must be 1..%d printable ASCII characters without spaces (who signs in, e.g. alice@laptop); got %d bytes", maxOperator, len(op))
	}
	for i := 0; i < len(op); i++ {
		if c := op[i]; c <= ' ' || c > '~' {
			return invalidf("operator has a character at byte %d that is not printable ASCII or is a space; want e.g. alice@laptop", i)
		}
	}
	return nil
}

// Admin returns the server's AdminService, for callers in the same
// process (the web console): the same calls clodexctl makes, without the
// network. Authentication is the caller's business; the console's is
// its sign-in links and sessions.
func (s *Server) Admin() controlplanev1.AdminServiceServer { return &adminService{s: s} }
