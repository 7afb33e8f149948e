package retry

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/clodex/clodex/dataplane/upstream"
)

// Facts are what the caller knows about a failure beyond the error itself.
type Facts struct {
	// AuthRefreshed is true when the credential was already refreshed for this request, so an
	// authentication or permission failure is final.
	AuthRefreshed bool
	// Reused is true when the attempt ran on a socket the request continued: a transport
	// failure then replaces the socket at once instead of backing off.
	Reused bool
	// Upstream names the upstream in messages (upstream.Key of its URL); "" reads "the
	// upstream".
	Upstream string
	// Now is the time of the failure, for how long an unreachable upstream has been failing.
	Now time.Time
	// ResponseEnded is true when the attempt's response failed with a frame
	// that ended it (an error, response.failed or response.incomplete
	// event, a response.completed without output: EndsResponse) on a socket
	// that is still open: nothing more of that response will arrive, so
	// the socket can carry the next attempt (Failure.KeepSocket).
	ResponseEnded bool
	// Wait is when a retry can next succeed, for a retryable failure that carries no hint of
	// its own (a 5xx, an unreachable upstream, a 429 without retry-after): Health.RetryAfter.
	// 0 means DefaultRetryAfter. Answer reads it.
	Wait time.Duration
}

func (f Facts) upstream() string {
	if f.Upstream == "" {
		return "the upstream"
	}
	return f.Upstream
}

// The failures of the other packages, by what they say of themselves
// (each package's error type has the method).
type (
	// refusal is the pacer's refusal of a new socket, with the wait it
	// asks for (control.RefusedError).
	refusal interface{ PacerRefusal() time.Duration }
	// loginRequired is a sign-in someone must renew, with the client's
	// words ("" for the standalone "run codex login")
	// (accounts.LoginRequiredError).
	loginRequired interface{ LoginRequired() string }
	// unavailable is a credential that cannot be had yet but may be soon,
	// with the client's words and when to try again
	// (accounts.UnavailableError).
	unavailable interface {
		Unavailable() (message string, retryAfter time.Duration)
	}
	// allLimited is every account at its usage limit, with the one that
	// resets first (accounts.AllLimitedError).
	allLimited interface {
		AllLimited() (account string, resetsAt time.Time, resetsIn time.Duration)
	}
	// agentRefused is the control plane refusing this data plane's agent
	// credential (revoked, or a token it does not know), with the client's
	// words: the cause and the fix (control.AgentRefusedError).
	agentRefused interface{ AgentRefused() string }
	// memberCap is a pacer refusal that is the member's own cap, not the
	// account's bucket: the member and its rate (control.RefusedError).
	memberCap interface {
		MemberCap() (member string, rate int)
	}
	// notAllowed is a turn whose member or request names an account it
	// may not run on here, with the client's words
	// (accounts.NotAllowedError).
	notAllowed interface{ NotAllowed() string }
	// chosenLimited is the account chosen for a turn (its member's pin, or
	// the account its request asks for) at its usage limit, with the
	// client's words and the reset (accounts.ChosenLimitedError).
	chosenLimited interface {
		Limited() (message string, resetsAt time.Time, resetsIn time.Duration)
	}
)

// CredentialError is a new socket whose credential could not be had (the
// pool's dial): whatever the cause, the turn ends with CredentialFailure's
// answer.
type CredentialError struct{ Err error }

func (e *CredentialError) Error() string { return e.Err.Error() }
func (e *CredentialError) Unwrap() error { return e.Err }

// loginRequiredMessage is the client's words for a dead standalone sign-in.
const loginRequiredMessage = "The ChatGPT sign-in can no longer be refreshed; run `codex login` to sign in again, then retry"

// Classify is the failure table: it maps what ended an attempt before any output reached the
// client to a Failure, whose Err is what the client is told should the turn end with it (an
// *UpstreamError wrapping the cause). In order:
//
//   - the pacer's refusal: Refused with its hint, answered 429 rate_limit_error (naming the
//     member's cap when that refused);
//   - an upstream known to be unreachable whose next probe is not due (*DownError): Fatal, no
//     dial was made; answered as the last attempt found it, saying for how long;
//   - a classified upstream failure (*UpstreamError: a failed response, an upgrade refused with
//     an HTTP status): previous_response_not_found and websocket_connection_limit_reached are
//     Replace; a context overflow, and a usage limit (usage_limit_reached, usage_not_included,
//     insufficient_quota) whatever its reset, are Fatal, never retried inside the data plane
//     (Answer tells the client when to come back); any other 429 (including an upgrade 403,
//     which reads as 429) is Throttled with its hint; 408, 409 and 5xx are Backoff; anything
//     else (400, 401, 403, 404, 413, …) is Fatal. A first 401 is still Fatal here: the
//     credential refresh and its one re-run belong to the caller;
//   - a credential that could not be had (CredentialError, or a sign-in that must be renewed,
//     one not to be had yet, every account at its usage limit, an agent credential the
//     control plane refuses, an account the turn may not run on here, the account chosen
//     for the turn at its usage limit): Fatal, CredentialFailure's answer;
//   - an upgrade refused with an HTTP status as the upgrade table says (a 5xx reads "Upstream
//     HOST: …"); a dial that opened no socket: Backoff, "The upstream HOST cannot be reached:
//     CAUSE";
//   - any other error (a socket that failed, a send, a dial error without a status): Replace
//     on a reused socket, Backoff on a new one, "The connection to HOST ended before the
//     response completed".
//
// A failed response that ended on an open socket (Facts.ResponseEnded) keeps that socket
// (Failure.KeepSocket) unless it is Replace or KeepsSocket refuses it: the next attempt, and the
// conversation's next turn, resend the whole conversation on it instead of spending a new
// socket (docs/errors.md §5.4).
//
// It returns nil for a nil err. A failure after output must not be classified: return it
// through Final.
func Classify(err error, f Facts) *Failure {
	if err == nil {
		return nil
	}
	var ue *UpstreamError
	var ref refusal
	var down *DownError
	var lr loginRequired
	var un unavailable
	var all allLimited
	var ce *CredentialError
	var unreach *upstream.UnreachableError
	var upg *upstream.UpgradeError
	switch {
	case errors.As(err, &ref):
		hint := ref.PacerRefusal()
		secs := int((hint + time.Second - 1) / time.Second)
		msg := fmt.Sprintf("The fleet's pacing of new upstream connections refused this request; retry after %ds", secs)
		var mc memberCap
		if errors.As(err, &mc) {
			if member, rate := mc.MemberCap(); member != "" {
				msg = fmt.Sprintf("Member %s's cap of %d new upstream connections a minute (clodexctl member create --rate) refused this request; retry after %ds",
					member, rate, secs)
			}
		}
		return &Failure{Class: Refused, Hint: hint, Kind: KindPacer, Status: http.StatusTooManyRequests, Err: &UpstreamError{
			Status: http.StatusTooManyRequests, Type: "rate_limit_error", RetryAfter: hint, Cause: err, Message: msg}}
	case errors.As(err, &down):
		// Not tried: the upstream is known unreachable and its next probe
		// is not due. Say what the last attempt found, and for how long.
		e := unreachableAnswer(down.Cause, f)
		e.Message += fmt.Sprintf(" (failing for %s; not tried again yet)", FormatWait(f.Now.Sub(down.Since)))
		e.Cause = err
		return &Failure{Class: Fatal, Kind: KindDown, Err: e}
	case errors.As(err, &ue):
		if ue == nil {
			return nil
		}
		fl := classifyUpstream(ue, err)
		fl.KeepSocket = f.ResponseEnded && fl.Class != Replace && KeepsSocket(ue)
		return fl
	case errors.As(err, &ce), errors.As(err, &lr), errors.As(err, &un), errors.As(err, &all), errors.As(err, new(agentRefused)),
		errors.As(err, new(notAllowed)), errors.As(err, new(chosenLimited)):
		return &Failure{Class: Fatal, Kind: KindCredential, Err: CredentialFailure(err, "")}
	case errors.As(err, &unreach):
		e := unreachableAnswer(err, f)
		e.Cause = err
		fl := &Failure{Class: Backoff, Kind: KindUnreachable, Err: e}
		if errors.As(err, &upg) {
			fl.Status = upg.Status
		}
		return fl
	case errors.As(err, &upg):
		e := ClassifyUpgrade(upg.Status, upg.RetryAfter)
		e.Cause = err
		fl := classifyUpstream(e, e)
		fl.Kind, fl.Status = KindUpgrade, upg.Status
		return fl
	}
	fl := Transport(err, f.Reused)
	fl.Err = &UpstreamError{Status: http.StatusBadGateway, Type: "api_error", Cause: err,
		Message: "The connection to " + f.upstream() + " ended before the response completed"}
	return fl
}

// KeepsSocket reports whether the socket whose response failed with e (a
// frame that ended the response) may carry the conversation's next
// attempt: every failed response but a rejected credential (401, 403: the
// socket was opened with it) and the failures whose fix is a new socket
// (previous_response_not_found, websocket_connection_limit_reached).
func KeepsSocket(e *UpstreamError) bool {
	switch {
	case e == nil:
		return false
	case e.Status == http.StatusUnauthorized, e.Status == http.StatusForbidden:
		return false
	case e.Code == CodePreviousResponseNotFound, e.Code == CodeConnectionLimit:
		return false
	}
	return true
}

// EndsResponse reports whether frame, the event that failed a response,
// ended it: a decodable error, response.failed, response.incomplete,
// response.completed or response.done event. An unreadable event does
// not: the response may go on, and its socket cannot carry another.
func EndsResponse(frame []byte) bool {
	v, err := decodeFrame(frame)
	if err != nil {
		return false
	}
	switch identifier(asMap(v)["type"]) {
	case "error", "response.failed", "response.incomplete", "response.completed", "response.done":
		return true
	}
	return false
}

// classifyUpstream is Classify of a classified upstream failure e; err is
// what the Failure carries (e itself, or an error wrapping it).
func classifyUpstream(e *UpstreamError, err error) *Failure {
	fail := &Failure{Class: Fatal, Kind: KindResponse, Status: e.Status, Err: err}
	switch {
	case e.Code == CodePreviousResponseNotFound, e.Code == CodeConnectionLimit:
		fail.Class, fail.Hint = Replace, e.RetryAfter
	case e.ContextOverflow, e.UsageLimit:
	case e.Status == 429:
		fail.Class, fail.Hint = Throttled, e.RetryAfter
	case e.Status == 408, e.Status == 409, e.Status >= 500:
		fail.Class = Backoff
	}
	return fail
}

// unreachableAnswer is what the client is told about a dial that opened no
// socket: an upgrade answered 5xx as the upgrade table says, anything else
// a 502 naming the upstream and the cause.
func unreachableAnswer(cause error, f Facts) *UpstreamError {
	var upg *upstream.UpgradeError
	if errors.As(cause, &upg) {
		e := ClassifyUpgrade(upg.Status, upg.RetryAfter)
		e.Message = "Upstream " + f.upstream() + ": " + e.Message
		return e
	}
	var unreach *upstream.UnreachableError
	why := "connection failed"
	if errors.As(cause, &unreach) {
		why = unreach.Cause
	}
	return &UpstreamError{Status: http.StatusBadGateway, Type: "api_error",
		Message: fmt.Sprintf("The upstream %s cannot be reached: %s", f.upstream(), why)}
}

// CredentialFailure is what the client is told when a turn's credential
// cannot be had: a data plane whose agent credential the control plane
// refuses (revoked, or never valid) is 403 permission_error in the
// refusal's words, never worth a retry, and so is an account the turn may
// not run on here (its member's or its request's); the account chosen for
// the turn (a pin, X-Clodex-Account) at its usage limit is 429 naming it
// and its reset, as one usage limit; a sign-in someone must renew is
// 401 authentication_error
// in the sign-in's own words (a fleet's operator must log the account in;
// standalone, run codex login), never worth a retry; a credential not to
// be had yet (the control plane's broker away) is 503 with its retry-after;
// every account at its usage limit is 429 naming the account whose reset
// comes first. Anything else is 401 authentication_error with otherwise as
// the message ("" for "OAuth credential is unavailable").
func CredentialFailure(err error, otherwise string) *UpstreamError {
	var lr loginRequired
	var un unavailable
	var all allLimited
	var ar agentRefused
	var na notAllowed
	var cl chosenLimited
	switch {
	case errors.As(err, &ar):
		return &UpstreamError{Status: http.StatusForbidden, Type: "permission_error", Message: ar.AgentRefused(), Permanent: true, Cause: err}
	case errors.As(err, &na):
		return &UpstreamError{Status: http.StatusForbidden, Type: "permission_error", Message: na.NotAllowed(), Permanent: true, Cause: err}
	case errors.As(err, &cl):
		msg, at, in := cl.Limited()
		return &UpstreamError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: CodeUsageLimitReached, Cause: err,
			Message: msg, UsageLimit: true, ResetsIn: max(in, time.Second), ResetsAt: at}
	case errors.As(err, &lr):
		msg := lr.LoginRequired()
		if msg == "" {
			msg = loginRequiredMessage
		}
		return &UpstreamError{Status: http.StatusUnauthorized, Type: "authentication_error", Message: msg, Permanent: true, Cause: err}
	case errors.As(err, &un):
		msg, retryAfter := un.Unavailable()
		return &UpstreamError{Status: http.StatusServiceUnavailable, Type: "api_error", Message: msg, RetryAfter: retryAfter, Cause: err}
	case errors.As(err, &all):
		account, resetsAt, resetsIn := all.AllLimited()
		in := max(resetsIn, time.Second)
		return &UpstreamError{
			Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: CodeUsageLimitReached, Cause: err,
			Message: fmt.Sprintf("Every ChatGPT account this data plane serves is at its usage limit; the first to reset is %s, at %s (in %s)",
				account, resetsAt.UTC().Format(time.RFC3339), FormatWait(in)),
			UsageLimit: true, ResetsIn: in, ResetsAt: resetsAt,
		}
	}
	if otherwise == "" {
		otherwise = "OAuth credential is unavailable"
	}
	return &UpstreamError{Status: http.StatusUnauthorized, Type: "authentication_error", Message: otherwise, Cause: err}
}

// Transport classifies a transport failure before any output (a socket error or close, a
// failed send, a dial error without an HTTP status): Replace on a reused socket, Backoff on a
// new one. err is surfaced as is if the retries run out.
func Transport(err error, reused bool) *Failure {
	if reused {
		return &Failure{Class: Replace, Kind: KindTransport, Err: err}
	}
	return &Failure{Class: Backoff, Kind: KindTransport, Err: err}
}

// Refusal classifies a pacer refusal: the next attempt waits exactly hint. err (the refusal's
// 429) is surfaced if the retries run out.
func Refusal(hint time.Duration, err error) *Failure {
	return &Failure{Class: Refused, Kind: KindPacer, Hint: hint, Err: err}
}

// Final marks err as fatal: Do returns it without retrying, even if it wraps a retryable
// *Failure. Use it for every failure once output has reached the client.
func Final(err error) error {
	if err == nil {
		return nil
	}
	return &Failure{Class: Fatal, Err: err}
}
