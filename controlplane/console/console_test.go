package console_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/clodex/clodex/controlplane"
	"github.com/clodex/clodex/controlplane/console"
	"github.com/clodex/clodex/controlplane/store"
	"github.com/clodex/clodex/internal/bearer"
	"github.com/clodex/clodex/internal/telemetry"
	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

const acctA = "acct_00000000000000aa"

// clock is a settable clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// fixture is a control plane (memory store) whose admin listener serves
// the console, as clodex-controlplane wires them, on a real loopback
// listener.
type fixture struct {
	t     *testing.T
	clk   *clock
	admin controlplanev1.AdminServiceServer
	con   *console.Console
	url   string // the admin listener's base URL
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	clk := &clock{t: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)}
	dir := t.TempDir()
	st, err := store.Open(store.Options{Dir: dir, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	logins, err := store.OpenLogins(dir)
	if err != nil {
		t.Fatal(err)
	}
	adminTok, _ := bearer.Parse("admin-token-0123456789")
	agentTok, _ := bearer.Parse("agent-token-0123456789")
	lis := httptest.NewUnstartedServer(nil)
	base := "http://" + lis.Listener.Addr().String()
	links, err := console.NewLinks(base, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := controlplane.New(controlplane.Options{Admissions: st, Policies: st, Agents: st, Quotas: st,
		Members: logins, MemberBuckets: st, Usage: st, AgentCreds: logins,
		AdminToken: adminTok, AgentToken: agentTok, Now: clk.now, ConsoleLinks: links})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	con, err := console.New(console.Config{Admin: srv.Admin(), Links: links, Now: clk.now, SampleEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h, err := telemetry.AdminHandler(telemetry.NewRegistry(), telemetry.AdminOptions{Listen: lis.Listener.Addr().String(), Console: con.Handler()})
	if err != nil {
		t.Fatal(err)
	}
	lis.Config.Handler = h
	lis.Start()
	t.Cleanup(lis.Close)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = con.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return &fixture{t: t, clk: clk, admin: srv.Admin(), con: con, url: base}
}

// link asks for a sign-in link the way clodexctl console does.
func (f *fixture) link(operator string) string {
	f.t.Helper()
	resp, err := f.admin.CreateConsoleLink(context.Background(), &controlplanev1.CreateConsoleLinkRequest{Operator: operator})
	if err != nil {
		f.t.Fatalf("CreateConsoleLink: %v", err)
	}
	return resp.GetUrl()
}

// browser is an HTTP client with a cookie jar that does not follow
// redirects, so each answer is seen.
func browser(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func (f *fixture) signIn(c *http.Client) string {
	f.t.Helper()
	resp, _ := get(f.t, c, f.link("alice@laptop"))
	if resp.StatusCode != http.StatusSeeOther {
		f.t.Fatalf("sign-in link answered %d, want 303 to the fleet", resp.StatusCode)
	}
	_, body := get(f.t, c, f.url+"/console/")
	m := csrfRE.FindStringSubmatch(body)
	if m == nil {
		f.t.Fatalf("the signed-in page carries no CSRF token:\n%s", body)
	}
	return m[1]
}

func (f *fixture) post(c *http.Client, path, origin string, form url.Values) (*http.Response, string) {
	f.t.Helper()
	req, err := http.NewRequest(http.MethodPost, f.url+path, strings.NewReader(form.Encode()))
	if err != nil {
		f.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := c.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func (f *fixture) setRate(key string, rate int32) {
	f.t.Helper()
	if _, err := f.admin.SetRate(context.Background(), &controlplanev1.SetRateRequest{Key: key, RatePerMinute: rate}); err != nil {
		f.t.Fatal(err)
	}
}

func TestWithoutSessionShowsNoFleetData(t *testing.T) {
	f := newFixture(t)
	f.setRate(acctA, 77)
	c := browser(t)
	for _, p := range []string{"/console/", "/console/account/" + acctA, "/console/?fragment=1"} {
		resp, body := get(t, c, f.url+p)
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without a session = %d, want 401", p, resp.StatusCode)
		}
		if strings.Contains(body, acctA) || strings.Contains(body, "77/min") {
			t.Errorf("GET %s without a session shows fleet data:\n%s", p, body)
		}
		if !strings.Contains(body, "clodexctl") {
			t.Errorf("GET %s without a session does not say how to sign in:\n%s", p, body)
		}
	}
}

func TestSignInOnceSetsAStrictCookie(t *testing.T) {
	f := newFixture(t)
	f.setRate(acctA, 77)
	link := f.link("alice@laptop")
	c := browser(t)
	resp, _ := get(t, c, link)
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/console/" {
		t.Fatalf("link answered %d to %q, want 303 to /console/", resp.StatusCode, resp.Header.Get("Location"))
	}
	raw := resp.Header.Get("Set-Cookie")
	for _, want := range []string{"clodex_console=", "Path=/console/", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(raw, want) {
			t.Errorf("Set-Cookie %q lacks %q", raw, want)
		}
	}
	if strings.Contains(raw, "Secure") {
		t.Errorf("Set-Cookie %q is Secure on plain http: the browser would drop it", raw)
	}
	if strings.Contains(raw, "admin-token") {
		t.Errorf("the cookie carries the admin token: %q", raw)
	}
	_, body := get(t, c, f.url+"/console/")
	if !strings.Contains(body, "signed in as alice@laptop") {
		t.Errorf("the fleet page does not name the operator:\n%s", body)
	}

	// The same link again, in another browser: refused.
	other := browser(t)
	resp, body = get(t, other, link)
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "already used or has expired") {
		t.Errorf("a used link answered %d:\n%s\nwant 403 saying it was used", resp.StatusCode, body)
	}
	if resp.Header.Get("Set-Cookie") != "" {
		t.Errorf("a used link set a cookie: %q", resp.Header.Get("Set-Cookie"))
	}
}

func TestLinkExpiresAfterAMinute(t *testing.T) {
	f := newFixture(t)
	link := f.link("alice@laptop")
	f.clk.add(61 * time.Second)
	resp, _ := get(t, browser(t), link)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a 61-second-old link answered %d, want 403", resp.StatusCode)
	}
}

func TestSessionExpiresWhenIdle(t *testing.T) {
	f := newFixture(t)
	c := browser(t)
	f.signIn(c)
	f.clk.add(59 * time.Minute)
	if resp, _ := get(t, c, f.url+"/console/"); resp.StatusCode != http.StatusOK {
		t.Fatalf("after 59 idle minutes: %d, want 200", resp.StatusCode)
	}
	f.clk.add(61 * time.Minute)
	if resp, _ := get(t, c, f.url+"/console/"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("after 61 idle minutes: %d, want 401 (the session ended)", resp.StatusCode)
	}
}

func TestEveryAnswerCarriesAStrictCSP(t *testing.T) {
	f := newFixture(t)
	c := browser(t)
	f.signIn(c)
	for _, p := range []string{"/console/", "/console/account/" + acctA, "/console/static/console.js"} {
		resp, _ := get(t, c, f.url+p)
		csp := resp.Header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "form-action 'self'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: Content-Security-Policy %q lacks %q", p, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") || strings.Contains(csp, "http") {
			t.Errorf("GET %s: Content-Security-Policy %q allows inline code or other origins", p, csp)
		}
	}
}

func TestSetRateNeedsSameOriginAndCSRF(t *testing.T) {
	f := newFixture(t)
	f.setRate(acctA, 60)
	c := browser(t)
	csrf := f.signIn(c)
	form := url.Values{"key": {acctA}, "rate": {"120"}, "csrf": {csrf}}
	cases := []struct {
		name   string
		origin string
		form   url.Values
	}{
		{"no Origin", "", form},
		{"another origin", "http://evil.example", form},
		{"another port", "http://127.0.0.1:1", form},
		{"no CSRF token", f.url, url.Values{"key": {acctA}, "rate": {"120"}}},
		{"a wrong CSRF token", f.url, url.Values{"key": {acctA}, "rate": {"120"}, "csrf": {"x" + csrf}}},
	}
	for _, tc := range cases {
		resp, body := f.post(c, "/console/set-rate", tc.origin, tc.form)
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("%s: set-rate answered %d (%s), want 403", tc.name, resp.StatusCode, body)
		}
	}
	if a := f.account(acctA); a.GetRatePerMinute() != 60 {
		t.Fatalf("after refused posts the rate is %d, want 60 unchanged", a.GetRatePerMinute())
	}
	resp, _ := f.post(c, "/console/set-rate", f.url, form)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("a same-origin set-rate with the CSRF token answered %d, want 303", resp.StatusCode)
	}
	if a := f.account(acctA); a.GetRatePerMinute() != 120 {
		t.Errorf("after the page's set-rate the admin API says %d/min, want 120", a.GetRatePerMinute())
	}
	_, body := get(t, c, f.url+resp.Header.Get("Location"))
	if !strings.Contains(body, "Rate of "+acctA+" set to 120 new sockets a minute") {
		t.Errorf("the page does not confirm the change:\n%s", body)
	}
	// A bad value is refused by the admin API and said in the page.
	resp, _ = f.post(c, "/console/set-rate", f.url, url.Values{"key": {acctA}, "rate": {"601"}, "csrf": {csrf}})
	_, body = get(t, c, f.url+resp.Header.Get("Location"))
	if !strings.Contains(body, "Not done:") || !strings.Contains(body, "601") {
		t.Errorf("a rate of 601 is not refused in the page:\n%s", body)
	}
	if a := f.account(acctA); a.GetRatePerMinute() != 120 {
		t.Errorf("after a refused 601 the rate is %d, want 120", a.GetRatePerMinute())
	}
}

func (f *fixture) account(key string) *controlplanev1.Account {
	f.t.Helper()
	resp, err := f.admin.GetAccount(context.Background(), &controlplanev1.GetAccountRequest{Key: key})
	if err != nil {
		f.t.Fatal(err)
	}
	return resp.GetAccount()
}

func TestLinksAreBounded(t *testing.T) {
	f := newFixture(t)
	var last error
	n := 0
	for ; n < 100; n++ {
		if _, last = f.admin.CreateConsoleLink(context.Background(), &controlplanev1.CreateConsoleLinkRequest{Operator: "a"}); last != nil {
			break
		}
	}
	if status.Code(last) != codes.ResourceExhausted || n != 32 {
		t.Errorf("after %d links: %v, want ResourceExhausted after 32", n, last)
	}
	f.clk.add(console.LinkTTL)
	if _, err := f.admin.CreateConsoleLink(context.Background(), &controlplanev1.CreateConsoleLinkRequest{Operator: "a"}); err != nil {
		t.Errorf("a link after the others expired: %v, want one", err)
	}
}

func TestOperatorIsChecked(t *testing.T) {
	f := newFixture(t)
	for _, op := range []string{"", "alice smith", strings.Repeat("a", 65), "al\x00ice"} {
		_, err := f.admin.CreateConsoleLink(context.Background(), &controlplanev1.CreateConsoleLinkRequest{Operator: op})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("operator %q: %v, want InvalidArgument", op, err)
		}
	}
}

func TestHostIsCheckedOnLoopback(t *testing.T) {
	f := newFixture(t)
	req, _ := http.NewRequest(http.MethodGet, f.url+"/console/", nil)
	req.Host = "rebound.example:80"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a rebound Host answered %d, want 403", resp.StatusCode)
	}
}

// The fleet page lists the members, and removing one from the page
// removes it through the admin API (as clodexctl member remove does).
func TestMembersListedAndRemoved(t *testing.T) {
	f := newFixture(t)
	sum := [32]byte{1, 2, 3}
	if _, err := f.admin.CreateMember(context.Background(), &controlplanev1.CreateMemberRequest{Name: "alice", KeySha256: sum[:], RatePerMinute: 3}); err != nil {
		t.Fatal(err)
	}
	c := browser(t)
	csrf := f.signIn(c)
	// The page reads the fleet every SampleEvery (an hour here): an
	// action asks for a read at once, as a set-rate does.
	f.post(c, "/console/set-adaptive", f.url, url.Values{"key": {acctA}, "adaptive": {"on"}, "csrf": {csrf}})
	body := waitBody(t, c, f.url+"/console/", `data-member="alice"`)
	if !strings.Contains(body, "3/min") {
		t.Errorf("the members table does not show alice's cap:\n%s", body)
	}
	resp, _ := f.post(c, "/console/remove-member", f.url, url.Values{"name": {"alice"}, "csrf": {csrf}})
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("remove-member answered %d, want 303", resp.StatusCode)
	}
	list, err := f.admin.ListMembers(context.Background(), &controlplanev1.ListMembersRequest{})
	if err != nil || len(list.GetMembers()) != 0 {
		t.Errorf("members after the page removed alice: %v, %v; want none", list.GetMembers(), err)
	}
	_, body = get(t, c, f.url+"/console/")
	if !strings.Contains(body, "Member alice removed") {
		t.Errorf("the page does not confirm the removal:\n%s", body)
	}
}

// waitBody polls a page until it contains want (the console reads the
// fleet in the background).
func waitBody(t *testing.T, c *http.Client, u, want string) string {
	t.Helper()
	var body string
	for range 100 {
		_, body = get(t, c, u)
		if strings.Contains(body, want) {
			return body
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("%s never showed %q:\n%s", u, want, body)
	return ""
}
