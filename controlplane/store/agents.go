package store

import (
	"context"
	"sync"
	"time"
)

// AgentStream identifies one agent stream: the agent's id and a nonce of
// the stream, so that a replica dropping a stream that ended does not
// forget the same agent's newer stream on another replica.
type AgentStream struct {
	Agent  string
	Stream string
}

// AgentInfo is what the fleet's roster holds of one connected agent, so
// that any replica can list every agent (clodexctl agents), not only the
// ones whose streams it holds.
type AgentInfo struct {
	ID                string   `json:"id"`
	Host              string   `json:"host"`
	Version           string   `json:"version"`
	CapabilityVersion int      `json:"capability_version"`
	Accounts          []string `json:"accounts"`
	// Replica is the control-plane replica holding the agent's stream.
	Replica         string `json:"replica,omitempty"`
	ConnectedUnixMs int64  `json:"connected_unix_ms"`
	LastSeenUnixMs  int64  `json:"last_seen_unix_ms"`
	// UntilUnixMs is when the agent stops counting as live without a
	// newer heartbeat.
	UntilUnixMs int64 `json:"until_unix_ms"`
}

// agentDir is the memory store's record of live agents: per account, the
// agents serving it, each with its stream and the instant it stops
// counting.
type agentDir struct {
	mu       sync.Mutex // guards accounts
	accounts map[string]map[string]agentEntry
}

type agentEntry struct {
	stream string
	until  time.Time
}

func (d *agentDir) touch(s AgentStream, keys []string, until time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.accounts == nil {
		d.accounts = map[string]map[string]agentEntry{}
	}
	for _, k := range keys {
		m := d.accounts[k]
		if m == nil {
			m = map[string]agentEntry{}
			d.accounts[k] = m
		}
		m[s.Agent] = agentEntry{stream: s.Stream, until: until}
	}
}

func (d *agentDir) drop(s AgentStream, keys []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, k := range keys {
		m := d.accounts[k]
		if e, ok := m[s.Agent]; ok && e.stream == s.Stream {
			delete(m, s.Agent)
			if len(m) == 0 {
				delete(d.accounts, k)
			}
		}
	}
}

func (d *agentDir) count(keys []string, now time.Time) []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]int, len(keys))
	for i, k := range keys {
		m := d.accounts[k]
		for id, e := range m {
			if now.Before(e.until) {
				out[i]++
			} else {
				delete(m, id)
			}
		}
		if len(m) == 0 {
			delete(d.accounts, k)
		}
	}
	return out
}

// TouchAgent records that stream s serves keys and counts as live until
// until; it replaces an older stream of the same agent.
func (m *Memory) TouchAgent(_ context.Context, s AgentStream, keys []string, until time.Time) error {
	m.agents.touch(s, keys, until)
	return nil
}

// DropAgent forgets stream s for keys (not a newer stream of its agent).
func (m *Memory) DropAgent(_ context.Context, s AgentStream, keys []string) error {
	m.agents.drop(s, keys)
	return nil
}

// LiveAgents counts, per key, the agents live at now.
func (m *Memory) LiveAgents(_ context.Context, keys []string, now time.Time) ([]int, error) {
	return m.agents.count(keys, now), nil
}
