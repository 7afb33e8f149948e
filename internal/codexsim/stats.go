package codexsim

import "maps"

// Stats are the emulator's counters, as served by GET /sim/stats.
type Stats struct {
	// Upgrades counts successful WebSocket upgrades.
	Upgrades int64 `json:"upgrades"`
	// UpgradesByAccount counts successful upgrades per account.
	UpgradesByAccount map[string]int64 `json:"upgrades_by_account"`
	// Upgrade403s counts throttle rejections only.
	Upgrade403s int64 `json:"upgrade_403s"`
	// Upgrade401s counts upgrades refused for the token or account header.
	Upgrade401s int64 `json:"upgrade_401s"`
	// Upgrade400s counts upgrades refused for a missing beta header.
	Upgrade400s int64 `json:"upgrade_400s"`
	// Upgrade5xxs counts injected upgrade failures.
	Upgrade5xxs int64 `json:"upgrade_5xxs"`
	// MaxUpgradesPerWindow is the most accepted upgrades seen in one
	// trailing window, by account.
	MaxUpgradesPerWindow map[string]int `json:"max_upgrades_per_window"`
	// OpenSockets is the number of sockets open now.
	OpenSockets int64 `json:"open_sockets"`
	// WriteTimeouts counts sockets closed because a frame could not be
	// written within Config.WriteTimeout (a client that does not read).
	WriteTimeouts int64 `json:"write_timeouts"`
	// Responses counts responses started (response.created sent),
	// prewarms included.
	Responses int64 `json:"responses"`
	// Prewarms counts generate:false responses.
	Prewarms int64 `json:"prewarms"`
	// ContinuedResponses counts non-prewarm responses whose
	// previous_response_id was found.
	ContinuedResponses int64 `json:"continued_responses"`
	// PreviousResponseNotFound counts creates refused with
	// previous_response_not_found.
	PreviousResponseNotFound int64 `json:"previous_response_not_found"`
	// CompletedResponses counts response.completed events.
	CompletedResponses int64 `json:"completed_responses"`
	// InputTokens, CachedTokens and OutputTokens sum the usage of every
	// response that reported usage (completed or incomplete).
	InputTokens  int64 `json:"input_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// UsageByAccount is the same usage per account (the ChatGPT account
	// id), with its completed responses.
	UsageByAccount map[string]AccountUsage `json:"usage_by_account"`
	// IdleSocketsClosed counts sockets closed by CloseIdle (POST
	// /sim/close-idle).
	IdleSocketsClosed int64 `json:"idle_sockets_closed"`
	// Events counts server events sent on sockets (error frames included).
	Events int64 `json:"events"`
	// TokenRefreshes and RefreshReuseDetected come from the OAuth emulator.
	TokenRefreshes       int64 `json:"token_refreshes"`
	RefreshReuseDetected int64 `json:"refresh_reuse_detected"`
	// Errors counts error frames and failed responses by error code.
	Errors map[string]int64 `json:"errors"`
}

// AccountUsage is one account's usage as the emulator counted it.
type AccountUsage struct {
	CompletedResponses int64 `json:"completed_responses"`
	InputTokens        int64 `json:"input_tokens"`
	CachedTokens       int64 `json:"cached_tokens"`
	OutputTokens       int64 `json:"output_tokens"`
}

func (st *Stats) init() {
	st.UpgradesByAccount = make(map[string]int64)
	st.Errors = make(map[string]int64)
	st.UsageByAccount = make(map[string]AccountUsage)
}

// count applies f to the counters under the stats lock.
func (s *Server) count(f func(*Stats)) {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	f(&s.stats)
}

// Stats returns a snapshot of the counters (the same fields as /sim/stats).
func (s *Server) Stats() Stats {
	s.statsMu.Lock()
	st := s.stats
	st.UpgradesByAccount = maps.Clone(s.stats.UpgradesByAccount)
	st.Errors = maps.Clone(s.stats.Errors)
	st.UsageByAccount = maps.Clone(s.stats.UsageByAccount)
	s.statsMu.Unlock()
	st.MaxUpgradesPerWindow = s.throttle.maxPerWindow()
	if s.auth != nil {
		as := s.auth.Stats()
		st.TokenRefreshes = as.TokenRefreshes
		st.RefreshReuseDetected = as.RefreshReuseDetected
	}
	return st
}
