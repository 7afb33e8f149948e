package console

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"google.golang.org/grpc/status"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// maxForm bounds a form's body: the console's forms are a few fields.
const maxForm = 4 << 10

// signIn redeems a one-time link: a session cookie and a redirect to the
// fleet, or a page saying the link was used or expired.
func (c *Console) signIn(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w)
	operator, ok := c.cfg.Links.redeem(r.URL.Query().Get("link"))
	if !ok {
		c.log.WarnContext(r.Context(), "console sign-in refused: the link is unknown, used or expired", "remote", r.RemoteAddr)
		c.render(w, http.StatusForbidden, "signin", &pageData{Title: "Sign in",
			Flash: "This sign-in link was already used or has expired (a link works once, within 60 s). Run clodexctl console for a new one."})
		return
	}
	id := c.sessions.start(operator)
	// Secure under TLS only: on a plain-http loopback listener a browser
	// would drop a Secure cookie.
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/console/", HttpOnly: true, //nolint:gosec // G124: Secure is set whenever the console is reached over TLS (see above)
		SameSite: http.SameSiteStrictMode, Secure: c.secure(r), MaxAge: int(SessionMax.Seconds())})
	c.log.InfoContext(r.Context(), "console sign-in", "operator", operator, "remote", r.RemoteAddr)
	http.Redirect(w, r, "/console/", http.StatusSeeOther)
}

// action wraps a state-changing request: it must come from a page of the
// console (same origin), carry the session's CSRF token and a small
// form. do returns where to go next and the confirmation to show there.
func (c *Console) action(do func(r *http.Request, operator string, form url.Values) (next, confirm string, err error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		if !sameOrigin(r, c.secure(r)) {
			c.log.WarnContext(r.Context(), "console request refused: not from the console's own origin",
				"path", r.URL.Path, "origin", r.Header.Get("Origin"), "remote", r.RemoteAddr)
			http.Error(w, "refused: state-changing console requests must come from the console's own pages (Origin "+
				strconv.Quote(r.Header.Get("Origin"))+" is not this console's)", http.StatusForbidden)
			return
		}
		ss, ok := c.sessions.get(r)
		if !ok {
			http.Error(w, "not signed in: run clodexctl console for a sign-in link", http.StatusUnauthorized)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxForm)
		if err := r.ParseForm(); err != nil {
			http.Error(w, "the form is too large or malformed", http.StatusBadRequest)
			return
		}
		if !ss.validCSRF(r.PostForm.Get("csrf")) {
			c.log.WarnContext(r.Context(), "console request refused: missing or wrong CSRF token", "operator", ss.operator, "path", r.URL.Path)
			http.Error(w, "refused: the form's CSRF token is missing or stale; reload the page and try again", http.StatusForbidden)
			return
		}
		next, confirm, err := do(r, ss.operator, r.PostForm)
		if err != nil {
			msg := err.Error()
			if st, ok := status.FromError(err); ok {
				msg = st.Message()
			}
			confirm = "Not done: " + msg
			c.log.WarnContext(r.Context(), "console action failed", "operator", ss.operator, "path", r.URL.Path, "err", msg)
		}
		c.sessions.setFlash(r, confirm)
		c.sampler.refresh()
		if next == "" {
			next = "/console/"
		}
		http.Redirect(w, r, next, http.StatusSeeOther)
	}
}

func (c *Console) signOut(r *http.Request, operator string, _ url.Values) (string, string, error) {
	c.sessions.end(r)
	c.log.InfoContext(r.Context(), "console sign-out", "operator", operator)
	return "/console/", "", nil
}

func (c *Console) setRate(r *http.Request, operator string, f url.Values) (string, string, error) {
	ctx := r.Context()
	key := f.Get("key")
	next := "/console/account/" + url.PathEscape(key)
	rate, err := strconv.Atoi(strings.TrimSpace(f.Get("rate")))
	if err != nil {
		return next, "", fmt.Errorf("rate %q is not a whole number; allowed 0..600 (0 turns pacing off)", f.Get("rate"))
	}
	req := &controlplanev1.SetRateRequest{Key: key, RatePerMinute: int32(min(max(rate, -1), 100000))} //nolint:gosec // G115: bounded above
	if b := strings.TrimSpace(f.Get("burst")); b != "" {
		burst, err := strconv.Atoi(b)
		if err != nil {
			return next, "", fmt.Errorf("burst %q is not a whole number; allowed 1..1000, or empty to keep it", b)
		}
		v := int32(min(max(burst, -1), 100000)) //nolint:gosec // G115: bounded above
		req.Burst = &v
	}
	resp, err := c.cfg.Admin.SetRate(ctx, req)
	if err != nil {
		return next, "", err
	}
	a := resp.GetAccount()
	c.log.InfoContext(ctx, "console action: rate set", slog.String("operator", operator), slog.String("account", a.GetKey()),
		slog.Int("rate_per_minute", int(a.GetRatePerMinute())), slog.Int("burst", int(a.GetBurst())))
	return next, fmt.Sprintf("Rate of %s set to %d new sockets a minute, burst %d.", a.GetKey(), a.GetRatePerMinute(), a.GetBurst()), nil
}

func (c *Console) setAdaptive(r *http.Request, operator string, f url.Values) (string, string, error) {
	ctx := r.Context()
	key := f.Get("key")
	next := "/console/account/" + url.PathEscape(key)
	if f.Get("back") == "fleet" {
		next = "/console/"
	}
	var on bool
	switch f.Get("adaptive") {
	case "on":
		on = true
	case "off":
	default:
		return next, "", fmt.Errorf("adaptive %q is invalid; want on or off", f.Get("adaptive"))
	}
	resp, err := c.cfg.Admin.SetAdaptive(ctx, &controlplanev1.SetAdaptiveRequest{Key: key, Enabled: on})
	if err != nil {
		return next, "", err
	}
	c.log.InfoContext(ctx, "console action: adaptive mode set", "operator", operator, "account", resp.GetAccount().GetKey(), "adaptive", on)
	return next, fmt.Sprintf("Adaptive mode of %s turned %s.", resp.GetAccount().GetKey(), f.Get("adaptive")), nil
}

func (c *Console) removeAgent(r *http.Request, operator string, f url.Values) (string, string, error) {
	ctx := r.Context()
	name := f.Get("name")
	if _, err := c.cfg.Admin.RemoveAgentCredential(ctx, &controlplanev1.RemoveAgentCredentialRequest{Name: name}); err != nil {
		return "/console/", "", err
	}
	c.log.InfoContext(ctx, "console action: agent credential removed", "operator", operator, "agent", name)
	return "/console/", fmt.Sprintf("Agent credential %s removed: its data planes can no longer use it.", name), nil
}

func (c *Console) removeMember(r *http.Request, operator string, f url.Values) (string, string, error) {
	ctx := r.Context()
	name := f.Get("name")
	if _, err := c.cfg.Admin.RemoveMember(ctx, &controlplanev1.RemoveMemberRequest{Name: name}); err != nil {
		return "/console/", "", err
	}
	c.log.InfoContext(ctx, "console action: member removed", "operator", operator, "member", name)
	return "/console/", fmt.Sprintf("Member %s removed: every data plane refuses the member's key within seconds.", name), nil
}
