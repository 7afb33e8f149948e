package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

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

// RosterKeep is how long the roster keeps an agent after it stopped
// counting as live (listed as not live, as a replica lists its expired
// agents until it drops them); older entries are removed when listed.
const RosterKeep = time.Minute

// maxRoster bounds the entries one listing reads.
const maxRoster = 100_000

var scriptRosterRemove = mustPlainScript("roster_remove")

// rosterKey is the hash of the fleet's agents: agent id -> "stream\n" +
// AgentInfo as JSON.
func (r *Redis) rosterKey() string { return r.prefix + "roster" }

// PutAgent records (or refreshes) an agent in the fleet's roster, stream
// s being the stream that carries it. The hash expires a while after the
// last write, so a fleet whose replicas all died leaves nothing behind.
func (r *Redis) PutAgent(ctx context.Context, s AgentStream, info AgentInfo) error {
	b, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("put agent %s: %w", info.ID, err)
	}
	return r.call(ctx, "roster", func(ctx context.Context) error {
		pipe := r.client.TxPipeline()
		pipe.HSet(ctx, r.rosterKey(), s.Agent, s.Stream+"\n"+string(b))
		pipe.PExpire(ctx, r.rosterKey(), 10*time.Minute)
		_, err := pipe.Exec(ctx)
		return err
	})
}

// RemoveAgent removes stream s's agent from the roster, unless a newer
// stream of the same agent (on any replica) has written it since.
func (r *Redis) RemoveAgent(ctx context.Context, s AgentStream) error {
	return r.call(ctx, "roster", func(ctx context.Context) error {
		return scriptRosterRemove.Run(ctx, r.client, []string{r.rosterKey()}, s.Agent, s.Stream).Err()
	})
}

// Agents returns the fleet's roster at now: every agent live or stopped
// for less than RosterKeep, in no particular order. Older entries are
// removed.
func (r *Redis) Agents(ctx context.Context, now time.Time) ([]AgentInfo, error) {
	var out []AgentInfo
	err := r.call(ctx, "roster", func(ctx context.Context) error {
		m, err := r.client.HGetAll(ctx, r.rosterKey()).Result()
		if err != nil {
			return err
		}
		var stale []string
		out = out[:0]
		for id, v := range m {
			if len(out) == maxRoster {
				break
			}
			_, js, ok := strings.Cut(v, "\n")
			var info AgentInfo
			if !ok || json.Unmarshal([]byte(js), &info) != nil || info.ID != id {
				stale = append(stale, id) // not one a replica wrote: drop it
				continue
			}
			if now.Sub(time.UnixMilli(info.UntilUnixMs)) > RosterKeep {
				stale = append(stale, id)
				continue
			}
			out = append(out, info)
		}
		// An entry refreshed between the read and this delete is lost
		// until its agent's next heartbeat (5 s) writes it again.
		if len(stale) > 0 {
			return r.client.HDel(ctx, r.rosterKey(), stale...).Err()
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list the fleet's agents: %w", err)
	}
	return out, nil
}
