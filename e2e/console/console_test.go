package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/clodex/clodex/bench/fleet/cluster"
	"github.com/clodex/clodex/internal/account"
)

// chromiumPath finds Debian's chromium; under CI a missing browser fails
// the test instead of skipping it.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	msg := "chromium is not installed (apt-get install chromium; scripts/test.sh installs it as root)"
	if os.Getenv("CI") != "" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// newBrowser starts a headless Chromium with a fresh profile and returns
// a tab's context.
func newBrowser(t *testing.T, ctx context.Context, chromium string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.WindowSize(1400, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	bctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	// Accept the pages' confirmation dialogs, as a person clicking OK:
	// the listener only passes the event on (it may not run commands);
	// acceptDialogs answers it, until the tab ends.
	dialogs := make(chan struct{}, 4) // a few dialogs may queue while one is answered
	if err := chromedp.Listen(bctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			select {
			case dialogs <- struct{}{}:
			default:
			}
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	done := make(chan struct{})
	go acceptDialogs(bctx, dialogs, done)
	t.Cleanup(func() { cancelTab(); <-done })
	return bctx
}

func acceptDialogs(tab context.Context, dialogs <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	for {
		select {
		case <-tab.Done():
			return
		case <-dialogs:
			_ = chromedp.Do(tab, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
				_, err := cdp.Call(ctx, t, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
				return err
			}))
		}
	}
}

// shot saves the tab's full page as name.png among the test's artifacts.
func shot(t *testing.T, tab context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(tab, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(t.ArtifactDir(), name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil { //nolint:gosec // G306: a screenshot for the reviewer
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}

func TestConsoleInABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	f := startFleet(t, ctx)
	cp := f.ControlPlane
	acct := account.Key(cluster.Account)

	// What the console should show: an agent credential, two live data
	// planes, and the account with quota figures from a few turns.
	cred := filepath.Join(t.TempDir(), "build-bot.token")
	if out, err := cp.Ctl(ctx, "agent", "create", "build-bot", "--accounts", cluster.Account, "--out", cred); err != nil {
		t.Fatalf("agent create: %v\n%s", err, out)
	}
	// A member, whose turns the usage tables attribute to her.
	aliceKey := filepath.Join(t.TempDir(), "alice.key")
	if out, err := cp.Ctl(ctx, "member", "create", "alice", "--rate", "30", "--out", aliceKey); err != nil {
		t.Fatalf("member create: %v\n%s", err, out)
	}
	key, err := os.ReadFile(aliceKey)
	if err != nil {
		t.Fatal(err)
	}
	alice := &http.Client{Transport: memberKey{key: strings.TrimSpace(string(key))}}
	for i := range 4 {
		dp := f.DataPlanes[i%len(f.DataPlanes)]
		// A data plane answers 503 until the member list reaches it.
		for try := 0; ; try++ {
			r := cluster.RunTurn(ctx, alice, dp.BaseURL, cluster.Retry{MaxRetries: 3}, func() float64 { return 0 })
			if r.OK {
				break
			}
			if try == 50 {
				t.Fatalf("turn %d through %s: %s", i, dp.BaseURL, r.Reason)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	link := strings.TrimSpace(string(must(cp.Ctl(ctx, "console", "--print-url", "--as", "alice@e2e"))))
	if !strings.HasPrefix(link, "http://"+cp.AdminAddr+"/console/signin?link=") {
		t.Fatalf("clodexctl console --print-url printed %q, want a link to %s/console/signin", link, cp.AdminAddr)
	}

	tab := newBrowser(t, ctx, chromium)
	row := fmt.Sprintf(`tr[data-account=%q]`, acct)
	if err := chromedp.Do(tab,
		chromedp.Navigate(link),
		chromedp.WaitVisible(`span.who`),
		// The page refreshes its live region every 3 s; the console reads
		// the fleet every 5 s.
		chromedp.WaitVisible(row),
		chromedp.WaitVisible(`tr[data-agent]`),
		chromedp.WaitVisible(`tr[data-credential="build-bot"]`),
		chromedp.WaitVisible(row+` .window`),
		chromedp.WaitVisible(`tr[data-member="alice"]`),
		// Her turns' usage: the data planes send it every second.
		chromedp.WaitVisible(`table.by-member tr[data-usage="alice"]`),
		chromedp.WaitVisible(fmt.Sprintf(`table.by-account tr[data-usage=%q]`, acct)),
	); err != nil {
		t.Fatalf("sign in and see the fleet: %v", err)
	}
	if turns := text(t, tab, `table.by-member tr[data-usage="alice"] td:nth-child(2)`); turns != "4" {
		t.Errorf("alice's turns in the usage table = %q, want the 4 she sent", turns)
	}
	if who := text(t, tab, `span.who`); who != "signed in as alice@e2e" {
		t.Errorf("header says %q, want the operator named in the link", who)
	}
	agents, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll("tr[data-agent]").length`))
	if err != nil {
		t.Fatal(err)
	}
	rate, usage := text(t, tab, row+` td.rate`), text(t, tab, row+` .window`)
	if agents != 2 {
		t.Errorf("the fleet page lists %d agents, want the 2 data planes", agents)
	}
	if !strings.HasPrefix(rate, "90/min · 5") {
		t.Errorf("the account's rate cell says %q, want 90/min · 5 (set by the fleet)", rate)
	}
	if !strings.Contains(usage, "primary") || !strings.Contains(usage, "%") {
		t.Errorf("the account's usage cell says %q, want its primary window's share", usage)
	}
	shot(t, tab, "1-fleet")

	// The account's page, and a set-rate from it.
	if err := chromedp.Do(tab,
		chromedp.Click(row+` a`),
		chromedp.WaitVisible(`#setrate`),
		chromedp.WaitVisible(`figure svg.chart`),
	); err != nil {
		t.Fatalf("open the account's page: %v", err)
	}
	if caption := text(t, tab, `figure figcaption`); !strings.HasPrefix(caption, "Tokens per hour") {
		t.Errorf("the account page's first chart is %q, want its tokens per hour from the usage ledger", caption)
	}
	shot(t, tab, "2-account")
	if err := chromedp.Do(tab,
		chromedp.SetValue(`#rate`, "135"),
		chromedp.SetValue(`#burst`, "7"),
		chromedp.Click(`#setrate`),
		chromedp.WaitVisible(`p.flash`),
	); err != nil {
		t.Fatalf("set the rate from the page: %v", err)
	}
	flash := text(t, tab, `p.flash`)
	if !strings.Contains(flash, "set to 135 new sockets a minute, burst 7") {
		t.Errorf("the page confirms %q, want the new rate and burst", flash)
	}
	shot(t, tab, "3-set-rate")
	if v, err := cp.Get(ctx); err != nil || v.RatePerMinute != 135 || v.Burst != 7 {
		t.Errorf("clodexctl get after the page's set-rate: %+v, %v; want 135/min, burst 7", v, err)
	}

	// Remove the agent credential from the fleet page (a confirmation
	// dialog, accepted).
	if err := chromedp.Do(tab,
		chromedp.Navigate("http://"+cp.AdminAddr+"/console/"),
		chromedp.WaitVisible(`tr[data-credential="build-bot"] button`),
		chromedp.Click(`tr[data-credential="build-bot"] button`),
		chromedp.WaitVisible(`p.flash`),
	); err != nil {
		t.Fatalf("remove the agent credential from the page: %v", err)
	}
	flash = text(t, tab, `p.flash`)
	if !strings.Contains(flash, "build-bot removed") {
		t.Errorf("the page confirms %q, want the credential removed", flash)
	}
	var creds []struct{ Name string }
	if out, err := cp.Ctl(ctx, "agent", "list", "-o", "json"); err != nil {
		t.Errorf("agent list: %v", err)
	} else if err := json.Unmarshal(out, &creds); err != nil || len(creds) != 0 {
		t.Errorf("agent list after the page's removal: %s (%v), want none", out, err)
	}

	// Remove the member from the fleet page (a confirmation, accepted).
	if err := chromedp.Do(tab,
		chromedp.Navigate("http://"+cp.AdminAddr+"/console/"),
		chromedp.WaitVisible(`tr[data-member="alice"] button`),
		chromedp.Click(`tr[data-member="alice"] button`),
		chromedp.WaitVisible(`p.flash`),
	); err != nil {
		t.Fatalf("remove the member from the page: %v", err)
	}
	if flash := text(t, tab, `p.flash`); !strings.Contains(flash, "Member alice removed") {
		t.Errorf("the page confirms %q, want the member removed", flash)
	}
	var members []struct{ Name string }
	if out, err := cp.Ctl(ctx, "member", "list", "-o", "json"); err != nil {
		t.Errorf("member list: %v", err)
	} else if err := json.Unmarshal(out, &members); err != nil || len(members) != 0 {
		t.Errorf("member list after the page's removal: %s (%v), want none", out, err)
	}

	// A cross-origin page that posts to the console: refused, nothing
	// changes.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `<!DOCTYPE html><form id="f" method="post" action="http://%s/console/set-rate">`+
			`<input name="key" value="%s"><input name="rate" value="1"><input name="csrf" value="guessed"></form>`+
			`<script>document.getElementById("f").submit()</script>`, cp.AdminAddr, acct)
	}))
	defer evil.Close()
	if err := chromedp.Do(tab, chromedp.Navigate(evil.URL)); err != nil {
		t.Fatalf("visit a cross-origin page that posts to the console: %v", err)
	}
	waitLocation(t, tab, "/console/set-rate")
	body := text(t, tab, `body`)
	if !strings.Contains(body, "refused") {
		t.Errorf("the console answered a cross-origin post with %q, want a refusal", body)
	}
	shot(t, tab, "4-cross-origin-refused")
	if v, err := cp.Get(ctx); err != nil || v.RatePerMinute != 135 {
		t.Errorf("after the cross-origin post: %+v, %v; want the rate still 135", v, err)
	}

	// The used link, in a new browser: refused, no fleet data.
	other := newBrowser(t, ctx, chromium)
	if err := chromedp.Do(other, chromedp.Navigate(link), chromedp.WaitVisible(`section.signin`)); err != nil {
		t.Fatalf("open the used link: %v", err)
	}
	body = text(t, other, `body`)
	if !strings.Contains(body, "already used or has expired") || strings.Contains(body, acct) {
		t.Errorf("a used link shows %q, want a refusal and no fleet data", body)
	}
	shot(t, other, "5-used-link")
}

func text(t *testing.T, tab context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(tab, chromedp.Text(sel))
	if err != nil {
		t.Fatalf("read %s: %v", sel, err)
	}
	return s
}

// waitLocation waits until the tab's location contains part (a form
// posted by the page navigates on its own).
func waitLocation(t *testing.T, tab context.Context, part string) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; {
		loc, err := chromedp.Run(tab, chromedp.Location())
		if err == nil && strings.Contains(loc, part) {
			if err := chromedp.Do(tab, chromedp.WaitReady(`body`)); err != nil {
				t.Fatal(err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tab is at %q (%v), want a location containing %q", loc, err, part)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func startFleet(t *testing.T, ctx context.Context) *cluster.Fleet {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("find the go command: %v", err)
	}
	bins, err := cluster.Build(ctx, goBin, root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// The data planes serve member keys and send their usage every second.
	f, err := cluster.Start(ctx, cluster.Options{Bins: bins, Dir: t.TempDir(), DataPlanes: 2, Rate: 90, Burst: 5, ControlPlaneAdmin: true,
		DataPlaneArgs: []string{"--member-keys", "--usage-flush", "1s"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// memberKey sends every request with a member's key, as a member's
// Claude Code does.
type memberKey struct{ key string }

func (m memberKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Api-Key", m.key)
	return http.DefaultTransport.RoundTrip(r)
}
