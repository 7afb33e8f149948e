package console

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	controlplanev1 "github.com/clodex/clodex/proto/gen/go/clodex/controlplane/v1"
)

// Admin is the part of the admin API (AdminService, as clodexctl calls
// it) the console reads and acts through. The control plane's own
// service implements it, in process.
type Admin interface {
	ListAccounts(context.Context, *controlplanev1.ListAccountsRequest) (*controlplanev1.ListAccountsResponse, error)
	GetAccount(context.Context, *controlplanev1.GetAccountRequest) (*controlplanev1.GetAccountResponse, error)
	ListAgents(context.Context, *controlplanev1.ListAgentsRequest) (*controlplanev1.ListAgentsResponse, error)
	ListQuotas(context.Context, *controlplanev1.ListQuotasRequest) (*controlplanev1.ListQuotasResponse, error)
	ListAgentCredentials(context.Context, *controlplanev1.ListAgentCredentialsRequest) (*controlplanev1.ListAgentCredentialsResponse, error)
	SetRate(context.Context, *controlplanev1.SetRateRequest) (*controlplanev1.SetRateResponse, error)
	SetAdaptive(context.Context, *controlplanev1.SetAdaptiveRequest) (*controlplanev1.SetAdaptiveResponse, error)
	RemoveAgentCredential(context.Context, *controlplanev1.RemoveAgentCredentialRequest) (*controlplanev1.RemoveAgentCredentialResponse, error)
	ListMembers(context.Context, *controlplanev1.ListMembersRequest) (*controlplanev1.ListMembersResponse, error)
	RemoveMember(context.Context, *controlplanev1.RemoveMemberRequest) (*controlplanev1.RemoveMemberResponse, error)
	GetUsage(context.Context, *controlplanev1.GetUsageRequest) (*controlplanev1.GetUsageResponse, error)
}

// Config configures a Console.
type Config struct {
	// Admin is the admin API. (Required)
	Admin Admin
	// Links redeems the sign-in links the CreateConsoleLink RPC issued.
	// (Required)
	Links *Links
	// Logger receives the log of sign-ins and actions, each with the
	// operator who did it. (Optional; default discards)
	Logger *slog.Logger
	// Now is the clock. (Optional; default time.Now)
	Now func() time.Time
	// SampleEvery is how often the fleet is read. (Optional; default 5s)
	SampleEvery time.Duration
}

// DefaultSampleEvery is the default Config.SampleEvery.
const DefaultSampleEvery = 5 * time.Second

//go:embed assets
var assets embed.FS

// Console is the web console: an http.Handler for /console/ and a loop
// (Run) that reads the fleet.
type Console struct {
	cfg      Config
	log      *slog.Logger
	sessions *sessions
	sampler  *sampler
	pages    *template.Template
	static   http.Handler
	mux      *http.ServeMux
}

// New returns a console. A missing required field is an error.
func New(cfg Config) (*Console, error) {
	var errs []error
	if cfg.Admin == nil {
		errs = append(errs, errors.New("console: field Admin is required"))
	}
	if cfg.Links == nil {
		errs = append(errs, errors.New("console: field Links is required"))
	}
	if cfg.SampleEvery < 0 {
		errs = append(errs, errors.New("console: field SampleEvery is negative; want 0 (default 5s) or more"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SampleEvery == 0 {
		cfg.SampleEvery = DefaultSampleEvery
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(assets, "assets/*.html")
	if err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, log: log.With("component", "controlplane/console"), sessions: newSessions(cfg.Now),
		sampler: newSampler(cfg.Admin, cfg.Now), pages: pages,
		static: http.StripPrefix("/console/static/", http.FileServerFS(static))}
	c.mux = c.routes()
	return c, nil
}

// Run reads the fleet every Config.SampleEvery until ctx ends.
func (c *Console) Run(ctx context.Context) error {
	c.sampler.run(ctx, c.cfg.SampleEvery)
	return nil
}

// Handler serves /console/. Mount it on the admin listener, which checks
// Host; the console checks Origin and the session itself.
func (c *Console) Handler() http.Handler { return c.mux }

func (c *Console) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /console/{$}", c.page(c.overview))
	mux.HandleFunc("GET /console", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/console/", http.StatusMovedPermanently)
	})
	mux.HandleFunc("GET /console/account/{key}", c.page(c.account))
	mux.HandleFunc("GET /console/signin", c.signIn)
	mux.HandleFunc("POST /console/signout", c.action(c.signOut))
	mux.HandleFunc("POST /console/set-rate", c.action(c.setRate))
	mux.HandleFunc("POST /console/set-adaptive", c.action(c.setAdaptive))
	mux.HandleFunc("POST /console/remove-agent", c.action(c.removeAgent))
	mux.HandleFunc("POST /console/remove-member", c.action(c.removeMember))
	mux.HandleFunc("GET /console/static/", func(w http.ResponseWriter, r *http.Request) {
		securityHeaders(w)
		c.static.ServeHTTP(w, r)
	})
	return mux
}

// securityHeaders are on every answer: a strict Content-Security-Policy
// (scripts and styles from the console only, no inline code, no frames,
// forms post only here), no sniffing, a referrer only to the console
// itself (a sign-in link never leaves in a Referer; "no-referrer" would
// make browsers send "Origin: null" on the console's own form posts), no
// caching of fleet data.
func securityHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
}

// sameOrigin reports whether a state-changing request comes from a page
// of the console itself: its Origin is this listener's (scheme and the
// Host the browser used) and, when the browser says, same-origin.
func sameOrigin(r *http.Request, secure bool) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return false
	}
	u, err := url.Parse(o)
	if err != nil {
		return false
	}
	scheme := "http"
	if secure {
		scheme = "https"
	}
	if u.Scheme != scheme || u.Host != r.Host || (u.Path != "" && u.Path != "/") {
		return false
	}
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return false
	}
	return true
}

// secure reports whether the browser reached the console over TLS (the
// listener's own, or a proxy's when the console's URL is https).
func (c *Console) secure(r *http.Request) bool {
	return r.TLS != nil || c.cfg.Links.base != "" && c.cfg.Links.base[:5] == "https"
}
